"""Hub ids without the wait: the local Hugging Face cache when the hub is off or out of reach, else one short
reachability probe (an HTTP HEAD request) before transformers is called.

Without this, transformers meets an absent network with retries and back-off (tens of seconds) and ends in a
traceback. Here an unreachable, uncached id fails in about PROBE_TIMEOUT_S with a message naming the id and
the three ways out.
"""
from __future__ import annotations

import functools
import os
import threading
from pathlib import Path

from qcls.errors import HubUnreachableError
from qcls.progress import warn

PROBE_TIMEOUT_S = 2.0
DEFAULT_ENDPOINT = "https://huggingface.co"


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT


def offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE), read now rather than at huggingface_hub's import."""
    flags = (os.environ.get("HF_HUB_OFFLINE", ""), os.environ.get("TRANSFORMERS_OFFLINE", ""))
    return any(f.strip().lower() in ("1", "true", "yes", "on") for f in flags)


def cache_dir() -> Path:
    """The hub cache as huggingface_hub resolves it, read from the environment at call time."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return Path(home).expanduser() / "hub"


@functools.lru_cache(maxsize=16)
def _probe(url: str, timeout: float) -> int | None:
    """The HTTP status of one HEAD request (redirects not followed), or None without an answer in time."""
    status: list[int] = []

    def ask() -> None:
        import urllib.error
        import urllib.request

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args, **kwargs):
                return None  # a 3xx is an answer: the file is there

        try:
            with urllib.request.build_opener(NoRedirect).open(urllib.request.Request(url, method="HEAD"),
                                                               timeout=timeout) as r:
                status.append(r.status)
        except urllib.error.HTTPError as e:
            status.append(e.code)
        except (OSError, ValueError):  # no route, DNS, refused, TLS, a dropped connection
            pass

    # The thread bounds the DNS lookup too, which socket timeouts do not cover.
    t = threading.Thread(target=ask, daemon=True)
    t.start()
    t.join(timeout)
    return status[0] if status else None


def probe(repo_id: str, revision: str | None, filename: str, timeout: float = PROBE_TIMEOUT_S) -> int | None:
    """HEAD the file transformers fetches first, where it fetches it; the answer is kept for the process.
    Not a TCP connect: a proxy may accept any connection and answer for a hub that is not there."""
    return _probe(f"{endpoint().rstrip('/')}/{repo_id}/resolve/{revision or 'main'}/{filename}", timeout)


def _answered(status: int | None) -> bool:
    return status is not None and (status < 400 or status in (401, 403))  # 401/403: gated, transformers says so


def cached_snapshot(repo_id: str, revision: str | None, filename: str) -> str | None:
    """The local snapshot folder of `repo_id` when it holds `filename`, else None (no network)."""
    from huggingface_hub import snapshot_download
    try:
        path = snapshot_download(repo_id, revision=revision, local_files_only=True, cache_dir=str(cache_dir()))
    except Exception:  # noqa: BLE001 - LocalEntryNotFoundError, a bad id …: all mean "not cached"
        return None
    return path if (Path(path) / filename).is_file() else None


def ways_out(repo_id: str) -> str:
    return (f"ways out:\n"
            f"  model.source=local model.path=DIR        a transformers checkpoint directory (config.json, "
            f"tokenizer, weights)\n"
            f"  model.source=gguf model.path=FILE.gguf   a GGUF file\n"
            f"  HF_HUB_OFFLINE=1 with the model in the HF cache ({cache_dir()}): download it once where the hub "
            f"is reachable, e.g. `hf download {repo_id}`")


def resolve_hub(repo_id: str, revision: str | None, gguf_file: str | None) -> tuple[str, str | None]:
    """(path, revision) for from_pretrained: the hub id when the hub answers, else the cached snapshot folder.
    Raises HubUnreachableError when neither is there."""
    want = gguf_file or "config.json"
    if offline():
        why = "HF_HUB_OFFLINE is set"
    else:
        status = probe(repo_id, revision, want)
        if _answered(status):
            return repo_id, revision
        why = (f"the hub ({endpoint()}) cannot be reached within {PROBE_TIMEOUT_S:g} s" if status is None else
               f"the hub ({endpoint()}) answers HTTP {status} for its {want}")
    snap = cached_snapshot(repo_id, revision, want)
    if snap is not None:
        warn(f"{why}: model {repo_id} is read from the local Hugging Face cache ({snap})")
        return snap, None
    raise HubUnreachableError(f"model.path={repo_id} is a hub id, {why}, and {want} of {repo_id} is not in the "
                              f"local Hugging Face cache ({cache_dir()})", ways_out(repo_id))
