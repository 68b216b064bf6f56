"""How the decoder's GEMMs scale with tokens per forward (GPU; not a test).

    PYTHONPATH=. python bench/gemm.py --models qwen3_4b

Times the four GEMMs of every layer (fused QKV, O, fused gate/up, down; cuBLAS, fp16, random weights) for
a range of token counts, captured in one CUDA graph per count, so the numbers are the forward's GEMM time
with no attention, norms or launch gaps. This is the part of the forward the engine cannot shrink except
by running fewer tokens: it bounds what batch 4 can cost relative to batch 1. Appends to bench/RESULTS.md.
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["qwen3_4b"], choices=["qwen3_4b", "qwen3_8b"])
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    for name in args.models:
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
