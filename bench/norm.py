"""The residual-add + RMSNorm kernel alone (GPU; not a test): float32 residual stream (qcls/engine/kernels.py)
against the pre-issue-18 fp16 one (bench/legacy_kernels.py), per warps setting, on Qwen3-4B/8B widths and
the token counts of 8 prompts at batch 1 and 4. Each timing is 72 calls (two per layer of a 36-layer
model) in one CUDA graph, the median of 30 replays. Appends to bench/RESULTS.md.

    PYTHONPATH=. python bench/norm.py
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import common as C  # noqa: E402
from bench import legacy_kernels as L  # noqa: E402
from qcls.engine import kernels as K  # noqa: E402


def main() -> None:
    rows = []
    for h in (2560, 4096):
        for n in (126, 440):
            x = torch.randn(n, h, device="cuda", dtype=torch.float16)
            w = torch.randn(h, device="cuda", dtype=torch.float16)
            r32 = torch.randn(n, h, device="cuda", dtype=torch.float32)
            r16 = r32.half()
            legacy = C.graph_ms(lambda: [L.add_rmsnorm(x, r16, w, 1e-6) for _ in range(72)])
            row = {"hidden": h, "tokens": n, "legacy fp16 residual": legacy}
            for warps in (2, 4, 8, 16):
                K.norm_warps = lambda _h, warps=warps: warps
                row[f"fp32 residual, {warps} warps"] = C.graph_ms(lambda: [K.add_rmsnorm(x, r32, w, 1e-6)
                                                                           for _ in range(72)])
            rows.append(row)
    keys = list(rows[0])
    text = C.header("norm kernel: float32 residual stream against fp16, per warps setting",
                    "bench/norm.py; 72 residual-add + RMSNorm calls (36 layers × 2) in one CUDA graph, ms per graph")
    text += "| " + " | ".join(keys) + " |\n|" + "---|" * len(keys) + "\n"
    for row in rows:
        text += "| " + " | ".join(f"{row[k]:.4f}" if isinstance(row[k], float) else str(row[k]) for k in keys) + " |\n"
    C.append(text)


if __name__ == "__main__":
    main()
