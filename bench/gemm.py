"""How the decoder's GEMMs scale with tokens per forward (GPU; not a test).

    PYTHONPATH=. python bench/gemm.py --models qwen3_4b
    PYTHONPATH=. python bench/gemm.py --models qwen3_4b gemma3_4b --residual-hints --rows 126 440 1760

Times the four GEMMs of every layer (fused QKV, O, fused gate/up, down; cuBLAS, fp16, random weights) for
a range of token counts, captured in one CUDA graph per count, so the numbers are the forward's GEMM time
with no attention, norms or launch gaps. This is the part of the forward the engine cannot shrink except
by running fewer tokens: it bounds what batch 4 can cost relative to batch 1. Appends to bench/RESULTS.md.

--residual-hints: the same chain with the engine's norms and activation between the GEMMs, in the decoder's order
(the float32 residual through every norm; the attention's place taken by a copy of the queries), the norms' L2
eviction hints (qcls/engine/kernels.py residual_hints) off and on in alternation: kernel time per kind (profiler)
and the chain's time (graph replays) per row count.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import common as C  # noqa: E402

TOKENS = [32, 64, 96, 120, 126, 128, 160, 192, 256, 320, 384, 416, 440, 448, 512]


def layer_weights(shape: dict, layers: int) -> list[list[torch.Tensor]]:
    h, i = shape["hidden_size"], shape["intermediate_size"]
    q, kv = shape["num_attention_heads"] * shape["head_dim"], shape["num_key_value_heads"] * shape["head_dim"]
    dims = [(q + 2 * kv, h), (h, q), (2 * i, h), (h, i)]
    return [[torch.randn(o, k, device="cuda", dtype=torch.float16) * 0.02 for o, k in dims] for _ in range(layers)]


def gemm_ms(weights, n: int, iters: int) -> float:
    x = torch.randn(n, weights[0][0].shape[1], device="cuda", dtype=torch.float16)
    mid = torch.randn(n, weights[0][1].shape[1], device="cuda", dtype=torch.float16)
    act = torch.randn(n, weights[0][3].shape[1], device="cuda", dtype=torch.float16)

    def run():
        for wqkv, wo, wgu, wd in weights:
            F.linear(x, wqkv)
            F.linear(mid, wo)
            F.linear(x, wgu)
            F.linear(act, wd)
    return C.graph_ms(run, iters)


def chain(weights, shape: dict, n: int, gemma: bool):
    """The layers' GEMMs with the decoder's norms and activation between them (random input rows)."""
    from qcls.engine import kernels as K
    h, q = shape["hidden_size"], shape["num_attention_heads"] * shape["head_dim"]
    x0 = torch.randn(n, h, device="cuda", dtype=torch.float16)
    norms = [[torch.randn(h, device="cuda", dtype=torch.float16) * 0.1 for _ in range(4)] for _ in weights]

    def norm(delta, res, w):
        if gemma:  # Gemma3: the post-norm, the residual add and the next norm in one launch
            return K.post_add_rmsnorm(delta, res, w[0], 1e-6, w[1], 1e-6, torch.float16, True)
        return K.add_rmsnorm(delta, res, w[0], 1e-6, torch.float16)

    def run():
        delta, res = x0, x0.float()
        for (wqkv, wo, wgu, wd), w in zip(weights, norms):
            x, res = norm(delta, res, w[:2])
            delta = F.linear(F.linear(x, wqkv)[:, :q].contiguous(), wo)  # (the copy: the attention's place)
            x, res = norm(delta, res, w[2:])
            delta = F.linear(K.gelu_tanh_mul(F.linear(x, wgu)) if gemma else K.silu_mul(F.linear(x, wgu)), wd)
        return delta
    return run


def kind_ms(graph: torch.cuda.CUDAGraph, reps: int = 20) -> dict[str, float]:
    """Kernel time per kind of one replay (ms): the norms, the activation, the rest (GEMMs and the copy)."""
    out = {"norms": 0.0, "activation": 0.0, "GEMMs and copy": 0.0}
    for name, us, _ in C.kernel_times(graph.replay, reps):
        out["norms" if "rmsnorm" in name else "activation" if "act_mul" in name else "GEMMs and copy"] += us / 1e3
    return out


def residual_hints(name: str, rows: list[int], rounds: int) -> str:
    """The chain with the norms' eviction hints off and on (kernels.RESIDUAL_HINTS forced), in alternation."""
    from qcls.engine import kernels as K
    gemma = name in C.GEMMA3_SHAPES
    shape = (C.GEMMA3_SHAPES if gemma else C.SHAPES)[name]
    weights = layer_weights(shape, shape["num_hidden_layers"])
    text = C.header(f"the norms' L2 eviction hints: {name} layer chain (fp16, one CUDA graph per setting)",
                    f"bench/gemm.py --models {name} --residual-hints --rows {' '.join(map(str, rows))} "
                    f"--rounds {rounds}; means over {rounds} rounds in alternation")
    text += "| rows | hints | norms ms | activation ms | GEMMs and copy ms | chain ms (replay median) |\n"
    text += "|---|---|---|---|---|---|\n"
    for n in rows:
        graphs, sums = {}, {}
        for on in (False, True):
            K.RESIDUAL_HINTS = on
            run = chain(weights, shape, n, gemma)
            run()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                run()
            graphs[on], sums[on] = g, {"chain": 0.0}
        for _ in range(rounds):
            for on, g in graphs.items():
                for k, v in kind_ms(g).items():
                    sums[on][k] = sums[on].get(k, 0.0) + v / rounds
                sums[on]["chain"] += C.replay_ms(g, 20) / rounds
        for on in (False, True):
            m = sums[on]
            text += (f"| {n} | {'on' if on else 'off'} | {m['norms']:.3f} | {m['activation']:.3f} | "
                     f"{m['GEMMs and copy']:.3f} | {m['chain']:.3f} |\n")
        del graphs
    K.RESIDUAL_HINTS = None
    del weights
    C.free()
    return text + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["qwen3_4b"], choices=["qwen3_4b", "qwen3_8b", "gemma3_4b"])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--residual-hints", action="store_true", help="the norms' L2 eviction hints off / on (see above)")
    ap.add_argument("--rows", type=int, nargs="+", default=[126, 440, 1760])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.residual_hints:
        for name in args.models:
            text = residual_hints(name, args.rows, args.rounds)
            print(text, flush=True)
            C.append(text)
        return
    for name in args.models:
        if name in C.GEMMA3_SHAPES:
            raise SystemExit("GEMM scaling: qwen3_4b, qwen3_8b (gemma3_4b with --residual-hints)")
        shape = C.SHAPES[name]
        weights = layer_weights(shape, shape["num_hidden_layers"])
        params = sum(w.numel() for ws in weights for w in ws)
        libs = {}
        for lib in ("cublas", "cublaslt"):  # torch's two routes to the same GEMMs; the engine uses the default
            torch.backends.cuda.preferred_blas_library(lib)
            libs[lib] = {n: gemm_ms(weights, n, args.iters) for n in TOKENS}
        torch.backends.cuda.preferred_blas_library("cublas")
        base = libs["cublas"][126]
        text = C.header(f"GEMM scaling: {name} layer GEMMs (fp16, one CUDA graph per token count)",
                        f"bench/gemm.py --models {name} --iters {args.iters}; {params / 1e9:.2f} B layer parameters")
        text += ("| tokens | cuBLAS ms | ×126 tokens | TFLOP/s | cuBLASLt ms |\n|---|---|---|---|---|\n")
        text += "".join(f"| {n} | {ms:.3f} | {ms / base:.2f} | {2 * params * n / ms / 1e9:.0f} | "
                        f"{libs['cublaslt'][n]:.3f} |\n" for n, ms in libs["cublas"].items())
        C.append(text + "\n")
        del weights
        C.free()


if __name__ == "__main__":
    main()
