"""Shared benchmark helpers: random-weight Qwen3 shapes, timing, copy bandwidth, RESULTS.md records."""
from __future__ import annotations

import datetime as dt
import gc
import statistics
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
SHAPES = {
    "qwen3_4b": dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, intermediate_size=9728, vocab_size=151936, tie_word_embeddings=True),
    "qwen3_8b": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, intermediate_size=12288, vocab_size=151936, tie_word_embeddings=False),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16, intermediate_size=128, vocab_size=151936, tie_word_embeddings=True),
}
# Gemma3-4B's text model (google/gemma-3-4b-pt config.json, text_config; issue 20): 5 sliding-window layers
# (1024) per global one, RoPE bases 1e4 local / 1e6 global, query_pre_attn_scalar 256; transformers'
# Gemma3TextConfig defaults give the pattern, bases and GELU-tanh. The global layers' linear RoPE scaling (×8)
# is left out: it changes values, not time.
GEMMA3_SHAPES = {
    "gemma3_4b": dict(hidden_size=2560, num_hidden_layers=34, num_attention_heads=8, num_key_value_heads=4,
                      head_dim=256, intermediate_size=10240, vocab_size=262208, sliding_window=1024,
                      query_pre_attn_scalar=256),
    "gemma3_tiny": dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
                        head_dim=32, intermediate_size=128, vocab_size=262208, sliding_window=8,
                        query_pre_attn_scalar=32, sliding_window_pattern=3),
}
MODELS = sorted(SHAPES) + sorted(GEMMA3_SHAPES)
# T4 (sm_75): ~320 GB/s, 65 TFLOP/s fp16 tensor-core peak. The projection assumes fractions of peak that
# small-batch fp16 GEMMs reach on Turing (documented in README; a projection, not a measurement).
T4_BW, T4_FLOPS, T4_BW_EFF, T4_FLOP_EFF = 320e9, 65e12, 0.75, 0.5


def model_config(name: str):
    """The transformers config of a shape in SHAPES or GEMMA3_SHAPES."""
    from transformers import Gemma3TextConfig, Qwen3Config
    if name in GEMMA3_SHAPES:
        return Gemma3TextConfig(**GEMMA3_SHAPES[name], rms_norm_eps=1e-6, max_position_embeddings=4096)
    return Qwen3Config(**SHAPES[name], rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=4096)


def random_model(cfg, device: str, dtype: torch.dtype, seed: int = 0):
    """A model of this config with N(0, 0.02) weights (norms at their identity: 1 for Qwen, 0 for Gemma's 1 + w):
    latency does not depend on values, but zeros would flatter the hardware."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" not in n:
                p.normal_(0, 0.02)
    return model.eval()


def random_qwen3(name: str, device: str, dtype: torch.dtype, seed: int = 0):
    """A Qwen3 (or, for a GEMMA3_SHAPES name, Gemma3) model of real shape with random weights."""
    return random_model(model_config(name), device, dtype, seed)


def t4_projection(lbytes: int, lparams: int, tokens: int) -> float:
    """ms on a T4: weight read at 75% of 320 GB/s plus GEMM FLOPs at 50% of 65 TFLOP/s (docs/design.md §8)."""
    return (lbytes / (T4_BW * T4_BW_EFF) + 2 * lparams * tokens / (T4_FLOPS * T4_FLOP_EFF)) * 1e3


def layer_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.model.layers.parameters())


def layer_params(model) -> int:
    return sum(p.numel() for p in model.model.layers.parameters())


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


def graph_ms(fn, iters: int = 30) -> float:
    """Median replay time (CUDA events) of `fn` captured in one CUDA graph: no Python launch overhead."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return replay_ms(g, iters)


def bucket_forward(bucket):
    """One forward of an engine bucket: its captured graph's replay, or the eager forward without graphs."""
    return bucket.graphs[0].replay if bucket.graphs else bucket.forward


def kernel_times(run, n: int = 20) -> list[tuple[str, float, float]]:
    """(kernel name, µs per call, launches per call) of the CUDA kernels that `run` (a graph replay, a forward)
    launches, by the torch profiler over n calls; the profiler's and the graph launch's own entries left out."""
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


def replay_ms(graph: "torch.cuda.CUDAGraph", iters: int = 30) -> float:
    """Median time of one replay of a captured CUDA graph (CUDA events)."""
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return median(times)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def copy_bandwidth_gbs() -> float:
    """Device copy bandwidth in GB/s counting bytes read + written (how facts.md measured the floor)."""
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = median(timed(lambda: y.copy_(x), 20))
    del x, y
    return 2 * (1 << 30) / (ms / 1e3) / 1e9


def matmul_tflops(n: int = 8192) -> float:
    """Dense fp16 n×n×n matrix products through cuBLAS, TFLOP/s (random data): the rate no attention kernel's
    dots can pass, the FLOP counterpart of copy_bandwidth_gbs."""
    a = torch.randn(n, n, device="cuda", dtype=torch.float16)
    b = torch.randn_like(a)
    ms = median(timed(lambda: a @ b, 10))
    del a, b
    return 2 * n ** 3 / (ms / 1e3) / 1e12


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def commit() -> str:
    """The commit measured (qcls/eval/timing.py: git, or QCLS_BENCH_COMMIT on a copy without .git)."""
    from qcls.eval.timing import commit as measured_commit
    return measured_commit()


def header(title: str, config: str) -> str:
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"\n## {title}\n\n- date: {now}\n- device: {device_name()} (torch {torch.__version__})\n"
            f"- commit: {commit()}\n- config: {config}\n\n")


def append(text: str) -> None:
    with RESULTS.open("a") as f:
        f.write(text)
    print(text, flush=True)


def report(text: str, no_append: bool) -> None:
    """A bench's section: appended to RESULTS.md (and printed), or with --no-append only printed."""
    if no_append:
        print(text, flush=True)
    else:
        append(text)


def free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
