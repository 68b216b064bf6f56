"""Where weights come from: a local HF directory, a hub id, a GGUF file, or an embedded demo model.

Every source ends as a transformers model + tokenizer on the CPU; backends then place and convert them.
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from qcls.backends import demos
from qcls.config import ModelSpec
from qcls.errors import ModelSourceError
from qcls.progress import step


@dataclass(frozen=True)
class Source:
    """A resolved checkpoint: `from_pretrained(path, gguf_file=…)` arguments."""
    path: str
    gguf_file: str | None = None
    revision: str | None = None


def default_cache_dir() -> Path:
    return Path(os.environ.get("QCLS_CACHE_DIR") or Path.home() / ".cache" / "qcls")


def demo_gguf_path(name: str = "smollm2_demo", cache_dir: str | None = None) -> Path:
    """The GGUF of a demo model (qcls/backends/demos.py), from its installed package(s)."""
    return demos.gguf_path(demos.get(name), cache_root(cache_dir))


def cache_root(cache_dir: str | None) -> Path:
    return Path(cache_dir) if cache_dir else default_cache_dir()


def convert_gguf(gguf: Path, out: Path) -> Path:
    """Dequantise a GGUF once into a plain safetensors checkpoint + tokenizer at `out` (atomic)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    # a temporary folder of this process's own: two processes converting at once must not delete each other's
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # A GGUF-loaded model carries a quantization marker and refuses save_pretrained: rebuild a plain one.
    cfg_dict = loaded.config.to_dict()
    cfg_dict.pop("quantization_config", None)
    cfg = AutoConfig.for_model(**cfg_dict)
    plain = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [m for m in missing if "lm_head" not in m]:
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    plain.tie_weights()
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "qcls_source.json").write_text(json.dumps({"gguf": str(gguf), "size": gguf.stat().st_size}))
    if (out / "qcls_source.json").is_file():  # another process finished first: keep its copy, which may be in use
        shutil.rmtree(tmp, ignore_errors=True)
        return out
    shutil.rmtree(out, ignore_errors=True)  # an incomplete copy (no marker): ours replaces it
    try:
        tmp.rename(out)
    except OSError:  # another process renamed its copy into place in between
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _demo_dir(spec: ModelSpec, cache_dir: str | None, gguf_size: int) -> Path:
    return cache_root(cache_dir) / f"{spec.name}-{gguf_size}"


def resolve(spec: ModelSpec, cache_dir: str | None) -> Source:
    """Turn a ModelSpec into from_pretrained arguments, converting the demo GGUF on first use."""
    if spec.source == "demo":
        demo = demos.get(spec.name)
        out = _demo_dir(spec, cache_dir, demos.size(demo))
        if not (out / "qcls_source.json").is_file():
            gguf = demos.gguf_path(demo, cache_root(cache_dir))
            with step(f"converting the demo model {gguf.name} into {out} (once)"):
                convert_gguf(gguf, out)
            if demo.chunked:  # assembled from the installed chunks only for this: not kept twice
                gguf.unlink(missing_ok=True)
                with contextlib.suppress(OSError):
                    gguf.parent.rmdir()
        return Source(str(out))
    return _resolve_files(spec)


def config_source(spec: ModelSpec, cache_dir: str | None) -> Source:
    """Where the model's config and tokenizer can be read without reading (or converting) any weight: the
    demo model's converted copy if it exists, else its GGUF file (header only)."""
    if spec.source != "demo":
        return _resolve_files(spec)
    demo = demos.get(spec.name)
    out = _demo_dir(spec, cache_dir, demos.size(demo))
    if (out / "qcls_source.json").is_file():
        return Source(str(out))
    gguf = demos.gguf_path(demo, cache_root(cache_dir))
    return Source(str(gguf.parent), gguf.name)


def _resolve_files(spec: ModelSpec) -> Source:
    """local / gguf / hub sources: checked before transformers is called, so a wrong path or an unreachable
    hub fails at once with the way out (qcls/backends/hub.py)."""
    from qcls.backends.hub import resolve_hub
    if spec.source == "local":
        path = Path(spec.path).expanduser()
        if not (path / "config.json").is_file():
            what = "does not exist" if not path.exists() else "is not a transformers checkpoint directory (no config.json)"
            raise ModelSourceError(f"model.path={path} {what}",
                                   "give the directory holding config.json, the tokenizer and the weights; for a "
                                   "GGUF file use model.source=gguf model.path=FILE.gguf, for a hub id "
                                   "model.source=hub model.path=ORG/NAME")
        return Source(str(path))
    if spec.source == "gguf":
        path = Path(spec.path).expanduser()
        if path.is_file():
            return Source(str(path.parent), path.name)
        if spec.gguf_file and path.is_dir():
            if not (path / spec.gguf_file).is_file():
                raise ModelSourceError(f"model.gguf_file={spec.gguf_file} is not in the directory {path}",
                                       "give the .gguf file's name inside model.path, or model.path=FILE.gguf")
            return Source(str(path), spec.gguf_file, spec.revision)
        if spec.gguf_file and not path.is_absolute() and spec.path.count("/") == 1:  # a hub id
            hub_path, revision = resolve_hub(spec.path, spec.revision, spec.gguf_file)
            return Source(hub_path, spec.gguf_file, revision)
        raise ModelSourceError(f"model.path={path} is not a .gguf file"
                               + ("" if path.exists() else " (it does not exist)"),
                               "give the file (model.path=FILE.gguf), or a directory / hub id with "
                               "model.gguf_file=NAME.gguf")
    hub_path, revision = resolve_hub(spec.path, spec.revision, spec.gguf_file)
    return Source(hub_path, spec.gguf_file, revision)


TOKENIZERS_KEPT = 16  # stored tokenizers, the most recently read kept
SMALL_TOKENIZER = 1 << 20  # bytes of tokenizer files under which reading the folder is as quick as the pickle


def load_tokenizer(src: Source):
    """The source's tokenizer. One read from a local folder is kept, pickled, in the cache folder: transformers
    parses a large tokenizer.json several times over (Gemma3's 262k tokens: about 6 s on a 2-core machine), the
    pickle loads in under half that. Keyed by the folder's files (name, size, time) and the library versions; read
    only if this user wrote it. A small tokenizer is not stored, and only the TOKENIZERS_KEPT most recently read
    are kept: every folder a process loads would otherwise leave one behind."""
    import pickle

    from transformers import AutoTokenizer
    stored = _stored_tokenizer(src)
    if stored is not None and stored.exists() and stored.stat().st_uid == os.getuid():
        try:
            with open(stored, "rb") as f:
                tok = pickle.load(f)
            os.utime(stored)  # recently read: kept longest
            return tok
        except Exception:  # noqa: BLE001 - a torn, stale or just evicted file: the folder is read again
            pass
    tok = AutoTokenizer.from_pretrained(src.path, gguf_file=src.gguf_file, revision=src.revision)
    if stored is not None:
        with contextlib.suppress(OSError):  # a read-only cache folder: read the folder every time
            write_atomically(stored, pickle.dumps(tok))
            _evict(stored.parent, TOKENIZERS_KEPT)
    return tok


def _evict(folder: Path, keep: int) -> None:
    def mtime(p: Path) -> float:
        try:
            return p.stat().st_mtime
        except OSError:
            return 0.0
    for old in sorted(folder.glob("*.pickle"), key=mtime, reverse=True)[keep:]:
        with contextlib.suppress(OSError):  # another process's eviction got there first
            old.unlink()


def _stored_tokenizer(src: Source) -> Path | None:
    import hashlib

    import tokenizers
    import transformers
    folder = Path(src.path)
    if src.gguf_file is not None or not folder.is_dir():
        return None
    files = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.iterdir())
             if p.is_file() and p.suffix not in (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".h5", ".msgpack")]
    if sum(size for _, size, _ in files) < SMALL_TOKENIZER:
        return None
    key = json.dumps([str(folder.resolve()), files, transformers.__version__, tokenizers.__version__, sys.version])
    return default_cache_dir() / "tokenizers" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.pickle"


@contextlib.contextmanager
def atomic_file(path: Path):
    """A temporary file beside `path` (mode 0600) to write whole; renamed over `path` when the block ends, removed
    if it raises: processes writing one cache entry at once each write a whole file, one wins."""
    import tempfile
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".part")
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_atomically(path: Path, data: bytes) -> None:
    """`data` as the file `path`, whole or not at all (atomic_file)."""
    with atomic_file(path) as tmp:
        tmp.write_bytes(data)


_gguf_scope = threading.local()  # .parsed: {file key: metadata} while a scope is open in this thread


@contextlib.contextmanager
def gguf_metadata_read_once():
    """Within it (in this thread), transformers parses a GGUF file's metadata once: it parses the whole header for
    the config, again for the tokenizer and again for the model's config (SmolLM2's: about 7 s each on a 2-core
    machine). Each reader gets its own copy; scopes nest; other threads are not affected."""
    _wrap_gguf_reader()
    outer = getattr(_gguf_scope, "parsed", None)
    if outer is None:
        _gguf_scope.parsed = {}
    try:
        yield
    finally:
        if outer is None:
            _gguf_scope.parsed = None


def _wrap_gguf_reader() -> None:
    """Put a reader that consults the thread's scope in place of transformers' (once per process; outside a scope
    it calls transformers' own)."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    original = gguf_utils.load_gguf_checkpoint
    if getattr(original, "qcls_scoped", False):
        return

    def read(path, return_tensors=False, *args, **kwargs):
        parsed = getattr(_gguf_scope, "parsed", None)
        if parsed is None or return_tensors or args or kwargs:
            return original(path, return_tensors, *args, **kwargs)
        st = os.stat(path)
        key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
        if key not in parsed:
            parsed[key] = original(path, return_tensors=False)
        return copy.deepcopy(parsed[key])

    read.qcls_scoped = True
    gguf_utils.load_gguf_checkpoint = read


def load_config(src: Source):
    from transformers import AutoConfig
    return AutoConfig.from_pretrained(src.path, gguf_file=src.gguf_file, revision=src.revision)


def load_model(src: Source, dtype: torch.dtype, layers: int | None = None, **kwargs):
    """The transformers model on the CPU (or where `device_map` in kwargs puts it). `layers`: only the first this
    many decoder layers, and no untied LM head (qcls/backends/partial.py); None: the whole model."""
    from transformers import AutoModelForCausalLM
    from qcls.backends import partial
    # an audit event (PEP 578): tooling can see which weights a process reads; the test suite keeps its `slow`
    # marker true with it
    sys.audit("qcls.load_model", src.path, src.gguf_file)
    config = load_config(src)
    layers = partial.plan_layers(config, layers)
    # a GGUF file is dequantised whole by transformers' loader anyway: it is cut in CPU memory after loading
    cut_after = layers is not None and src.gguf_file is not None
    if layers is not None and not cut_after:
        kwargs["config"] = partial.truncated_config(config, layers)
        # the later layers are the loader's "unexpected" keys by design: its report is checked here instead
        with partial.quiet_loader():
            model, info = AutoModelForCausalLM.from_pretrained(src.path, gguf_file=src.gguf_file,
                                                               revision=src.revision, dtype=dtype,
                                                               output_loading_info=True, **kwargs)
        partial.check_loading_info(info, layers)
    else:
        model = AutoModelForCausalLM.from_pretrained(src.path, gguf_file=src.gguf_file, revision=src.revision,
                                                     dtype=dtype, **kwargs)
    if cut_after:
        partial.cut(model, config, layers)
    elif layers is not None:
        partial.finish(model, config, layers, partial.safetensors_reader(src.path))
    return model.eval()
