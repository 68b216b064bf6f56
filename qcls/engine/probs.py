"""Every prompt's label probabilities, next to the tail's scores, on the device.

The tail's scores (engine/tail.py: the raw block, then the head block, each (query, prompt, label)-major) are
softmaxed per (query, prompt) in float64, the precision the host used before (classifier._build), and written
after the scores themselves as one float64 buffer [raw, head, softmax(raw), softmax(head)]: the host copies it
back once and only slices it (a Python softmax over 220 labels was a third of building a batch-4 result).

On a GPU it is one Triton kernel in the tail's CUDA graph; elsewhere the same numbers from torch ops.
"""
from __future__ import annotations

import torch

from qcls.engine.kernels import triton, use_triton

if triton is not None:
    import triton.language as tl

    @triton.jit
    def _softmax_kernel(x_ptr, idx_ptr, out_ptr, S, N2, L: tl.constexpr, BS: tl.constexpr, BL: tl.constexpr):
        """Segments s (rows of idx [S, L]: positions in x, -1 padding): out[i] = x[i] (float64), out[N2 + i] =
        softmax over the segment, max-shifted, in float64. Every position lies in exactly one segment."""
        s = tl.program_id(0) * BS + tl.arange(0, BS)
        j = tl.arange(0, BL)[None, :]
        ok = (s < S)[:, None] & (j < L)
        i = tl.load(idx_ptr + s[:, None] * L + j, mask=ok, other=-1)
        valid = i >= 0
        x = tl.load(x_ptr + tl.where(valid, i, 0), mask=valid, other=float("-inf")).to(tl.float64)
        m = tl.max(x, 1)
        e = tl.where(valid, tl.exp(x - m[:, None]), 0.0)
        p = e / tl.sum(e, 1)[:, None]
        tl.store(out_ptr + i, x, mask=valid)
        tl.store(out_ptr + N2 + i, p, mask=valid)


class Probabilities:
    """For one batch size: `(scores [2n] float32) → [4n] float64`, into a static buffer (capturable)."""

    def __init__(self, label_counts: list[int], b: int, device: torch.device):
        segments, off = [], 0
        for _ in range(2 * b):  # the raw block's (query, prompt) segments, then the head block's
            for c in label_counts:
                segments.append((off, c))
                off += c
        self.n2 = off
        self.width = max(label_counts)
        idx = torch.full((len(segments), self.width), -1, dtype=torch.long)
        for s, (o, c) in enumerate(segments):
            idx[s, :c] = torch.arange(o, o + c)
        self.idx = idx.to(device)
        self.pad = torch.where(idx >= 0, idx, off).to(device)  # torch path: position 2n is the appended -inf
        self.valid = (idx >= 0).view(-1).nonzero().squeeze(1).to(device)  # segments are contiguous and in order
        self.out = torch.empty(2 * off, dtype=torch.float64, device=device)
        self.fused = use_triton(self.out)

    def __call__(self, scores: torch.Tensor, impl: str = "auto") -> torch.Tensor:
        """impl: auto (Triton on a GPU), or torch / triton (tests)."""
        if impl == "triton" or (impl == "auto" and self.fused):
            s = self.idx.shape[0]
            _softmax_kernel[(triton.cdiv(s, 32),)](scores, self.idx, self.out, s, self.n2, L=self.width, BS=32,
                                                   BL=triton.next_power_of_2(self.width))
            return self.out
        x = scores.double()
        ext = torch.cat([x, x.new_full((1,), float("-inf"))])
        self.out[:self.n2] = x
        self.out[self.n2:] = torch.softmax(ext[self.pad], -1).view(-1)[self.valid]
        return self.out


def split_blocks(flat: list[float], b: int, label_counts: list[int]) -> tuple[list, list, list, list]:
    """A copied-back buffer (`Probabilities.out`: raw, calibrated, softmax(raw), softmax(calibrated)) as four
    [query][prompt][label] lists (written out, not looped over: this runs on every request)."""
    raw, cal, raw_p, cal_p, i = [], [], [], [], 0
    c1 = len(flat) // 4
    c2, c3 = 2 * c1, 3 * c1
    for _ in range(b):
        r, c, rp, cp = [], [], [], []
        for n in label_counts:
            j = i + n
            r.append(flat[i:j])
            c.append(flat[c1 + i:c1 + j])
            rp.append(flat[c2 + i:c2 + j])
            cp.append(flat[c3 + i:c3 + j])
            i = j
        raw.append(r)
        cal.append(c)
        raw_p.append(rp)
        cal_p.append(cp)
    return raw, cal, raw_p, cal_p
