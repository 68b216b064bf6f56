"""Shared benchmark helpers: random-weight models and checkpoints of real shapes, timing,
kernel profiles, score comparisons, the T4 projection, RESULTS.md records."""
from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import re
import statistics
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import torch

from qcls.check.served import T4_BW, T4_BW_EFF, t4_projection  # noqa: F401 - the T4 model (docs/design.md §8)
from qcls.sweep.timing import commit  # the commit measured: git, or QCLS_BENCH_COMMIT on a copy without .git

# QCLS_BENCH_RESULTS: another file to append to (the smoke tests write there, never into the log)
RESULTS = Path(os.environ.get("QCLS_BENCH_RESULTS") or Path(__file__).resolve().parent / "RESULTS.md")
SHAPES = {
    "qwen3_4b": dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, intermediate_size=9728, vocab_size=151936, tie_word_embeddings=True),
    "qwen3_8b": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, intermediate_size=12288, vocab_size=151936, tie_word_embeddings=False),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16, intermediate_size=128, vocab_size=151936, tie_word_embeddings=True),
}
# Gemma3-4B's text model (google/gemma-3-4b-pt, text_config); Gemma3TextConfig's defaults give the sliding-window
# pattern, RoPE bases and GELU-tanh. The global layers' RoPE scaling (×8) is left out: it changes values, not time.
GEMMA3_SHAPES = {
    "gemma3_4b": dict(hidden_size=2560, num_hidden_layers=34, num_attention_heads=8, num_key_value_heads=4,
                      head_dim=256, intermediate_size=10240, vocab_size=262208, sliding_window=1024,
                      query_pre_attn_scalar=256),
}
MODELS = sorted(SHAPES) + sorted(GEMMA3_SHAPES)


def joined_ray() -> bool:
    """A cluster named by RAY_ADDRESS is joined and left as it was found: only this run's app is deleted."""
    return bool(os.environ.get("RAY_ADDRESS"))


def model_config(name: str):
    """The transformers config of a shape in SHAPES or GEMMA3_SHAPES."""
    from transformers import Gemma3TextConfig, Qwen3Config
    if name in GEMMA3_SHAPES:
        return Gemma3TextConfig(**GEMMA3_SHAPES[name], rms_norm_eps=1e-6, max_position_embeddings=4096)
    return Qwen3Config(**SHAPES[name], rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=4096)


def random_model(shape, device: str, dtype: torch.dtype, seed: int = 0):
    """A model of `shape` (a name in SHAPES or GEMMA3_SHAPES, or a transformers config) with N(0, 0.02) weights
    (norms at their identity: 1 for Qwen, 0 for Gemma's 1 + w): latency does not depend on values, but zeros would
    flatter the hardware."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(model_config(shape) if isinstance(shape, str) else shape, dtype=dtype)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" not in n:
                p.normal_(0, 0.02)
    return model.eval()


def device_dtype() -> tuple[str, torch.dtype]:
    """Where the benches run and in what: fp16 on the GPU, float32 on the CPU (smoke runs)."""
    return ("cuda", torch.float16) if torch.cuda.is_available() else ("cpu", torch.float32)


def loaded(model, tok=None):
    """`model` as the engine takes it (a LoadedModel), with the real Qwen tokenizer unless `tok` is given."""
    from qcls.backends.base import LoadedModel, module_bytes
    from qcls.testing.qwen_tokenizer import build_qwen_tokenizer
    return LoadedModel(model, tok or build_qwen_tokenizer(), torch.device(model.device.type), model.dtype, "fp16",
                       memory=module_bytes(model))


def family(shape: str) -> str:
    """The model config a shape's runs compose (prompts, template): qwen3_8b's own, else qwen3_4b's."""
    return "qwen3_8b" if shape == "qwen3_8b" else "qwen3_4b"


def random_checkpoint(shape: str) -> Path:
    """random_model's weights and the real Qwen tokenizer as a local checkpoint (written once, then reused)."""
    out = Path(f"/tmp/qcls_random_{shape}")
    if (out / "qcls_bench.json").is_file():
        return out
    from qcls.testing.qwen_tokenizer import save_qwen_tokenizer
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    model = random_model(shape, dev, torch.float16)
    model.save_pretrained(str(out))
    save_qwen_tokenizer(out)
    del model
    free()
    (out / "qcls_bench.json").write_text(f'{{"shape": "{shape}"}}')
    print(f"[bench] random {shape} checkpoint written to {out} in {time.perf_counter() - t0:.0f}s", flush=True)
    return out


def checkpoint_overrides(shape: str) -> list[str]:
    """Hydra overrides that load random_checkpoint(shape) (the family's config for everything but the weights)."""
    return [f"model={family(shape)}", "model.source=local", f"model.path={random_checkpoint(shape)}",
            f"model.name=random_{shape}", "model.head=null"]


def scores(results) -> list[list[list[float]]]:
    """Classifier results' label scores, [query][prompt][label] (score_diff's input)."""
    return [[[lab.score for lab in p.labels] for p in r.prompts] for r in results]


def score_diff(got, want) -> dict:
    """max |Δ score|, share of winners equal and prompts compared of `got` against `want`, [query][prompt][label]."""
    d, same = 0.0, []
    for gq, wq in zip(got, want):
        for gp, wp in zip(gq, wq):
            d = max(d, max(abs(a - b) for a, b in zip(gp, wp)))
            same.append(int(np.argmax(gp) == np.argmax(wp)))
    return {"max_abs_diff": d, "winners_equal": float(np.mean(same)) if same else 1.0, "n": len(same)}


def paired_p50(a, b, queries, iters: int, per_pair) -> tuple[float, float, float]:
    """p50 of a and of b, their requests timed in alternation (drift hits both alike) after 3 warm requests each,
    and the median over the pairs of per_pair(ms of a, ms of b)."""
    ta, tb = [], []
    for clf in (a, b):
        for _ in range(3):
            clf.classify(queries)
    for _ in range(iters):
        for clf, out in ((a, ta), (b, tb)):
            sync()
            t0 = time.perf_counter()
            clf.classify(queries)
            sync()
            out.append((time.perf_counter() - t0) * 1e3)
    return median(ta), median(tb), median([per_pair(x, y) for x, y in zip(ta, tb)])


KINDS = [("attention", r"fmha|attention|attn|prefix_kernel|row_kernel"), ("gemm", r"gemm|cutlass|xmma|sm\d+_|cublas|matmul"),
         ("norm/reduce", r"reduce|norm|mean|sum"), ("copy/index", r"copy|index|gather|scatter|cat")]


def kernel_kind(name: str) -> str:
    return next((k for k, rx in KINDS if re.search(rx, name, re.I)), "elementwise/other")


def layer_sizes(model) -> tuple[int, int]:
    """(bytes, parameters) of the decoder layers: what the T4 projection and the weight-read floor take."""
    ps = list(model.model.layers.parameters())
    return sum(p.numel() * p.element_size() for p in ps), sum(p.numel() for p in ps)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, iters: int, warm: int = 3) -> list[float]:
    for _ in range(warm):
        fn()
    sync()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def kernel_times(run, n: int = 20) -> list[tuple[str, float, float]]:
    """(kernel name, µs per call, launches per call) of the CUDA kernels `run` launches (torch profiler, n calls)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            run()
        sync()
    out = []
    for ev in prof.key_averages():
        us = getattr(ev, "device_time_total", 0.0) or getattr(ev, "cuda_time_total", 0.0)
        if us > 0 and not ev.key.startswith(("ProfilerStep", "cudaGraph")):
            out.append((ev.key, us / n, ev.count / n))
    return out


def pct(xs: list[float], p: float) -> float:
    """The p-th percentile (nearest rank) of xs; nan for none."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * len(xs) + 0.5) - 1))] if xs else float("nan")


median = statistics.median


def copy_bandwidth_gbs() -> float:
    """Device copy bandwidth in GB/s counting bytes read + written (the weight-read floor's convention)."""
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = median(timed(lambda: y.copy_(x), 20))
    return 2 * (1 << 30) / (ms / 1e3) / 1e9


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def parser(doc: str) -> argparse.ArgumentParser:
    """A bench's argument parser: its module docstring as the help, and --no-append."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-append", action="store_true", help="print, do not append to RESULTS.md")
    return ap


def header(title: str, config: str) -> str:
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"\n## {title}\n\n- date: {now}\n- device: {device_name()} (torch {torch.__version__})\n"
            f"- commit: {commit()}\n- config: {config}\n\n")


def report(text: str, no_append: bool = False, name: str | None = None, data=None) -> None:
    """A bench's section: printed, and appended to RESULTS.md unless no_append; `data` to $OUT/NAME.json."""
    if not no_append:
        with RESULTS.open("a") as f:
            f.write(text if text.startswith("\n") else "\n" + text)
    print(text, flush=True)
    if name and os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        Path(os.environ["OUT"], f"{name}.json").write_text(json.dumps(data, indent=1, default=str))


def free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class GpuSampler:
    """nvidia-smi's `field` (utilization.gpu, memory.used in MiB) per GPU index, every `every` seconds, with the
    host's clock."""

    def __init__(self, every: float = 0.5, field: str = "utilization.gpu"):
        self.every, self.field, self.samples, self.stop = every, field, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        cmd = ["nvidia-smi", f"--query-gpu=index,{self.field}", "--format=csv,noheader,nounits"]
        while not self.stop.wait(self.every):
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=5).stdout
            except (OSError, subprocess.SubprocessError):
                return  # no nvidia-smi (a CPU run): no GPU column
            t = time.time()
            for line in out.strip().splitlines():
                idx, util = (x.strip() for x in line.split(","))
                self.samples.append((t, idx, float(util)))

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    def mean(self, gpu: str, t0: float, t1: float) -> float | None:
        xs = [u for t, i, u in self.samples if i == gpu and t0 <= t <= t1]
        return sum(xs) / len(xs) if xs else None
