"""The elementwise halves of a W8A8 linear (qcls/engine/int8_linear.py): quantizing an activation per row, and
scaling the GEMM's int32 result back. Triton on CUDA, plain torch elsewhere; the torch versions define the math.

Rounding is to the nearest integer, ties to even, in both (torch.round; `rint` below, in exact float32 steps that
Triton's interpreter runs too), so the two agree on the int8 values wherever their float32 inputs agree.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs
    triton = None

QMAX = 127.0
TINY = 1e-12  # an all-zero row gets this scale: its q is 0 and the product 0


def use_triton(x: torch.Tensor) -> bool:
    return triton is not None and x.is_cuda


def as_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t.to(dtype) without the call where t has it already (the torch kernels run a few hundred such conversions a
    forward; on the CPU each is a dispatch that returns t itself)."""
    return t if t.dtype == dtype else t.to(dtype)


@dataclass
class Int32Product:
    """A W8A8 GEMM's int32 result with the two scales that make it the linear's output, acc · xscale[:, None] ·
    wscale[None, :], handed as it is to the kernel that reads that output (the next norm, the gated activation),
    which applies the scales as it loads: no launch and no float copy of its own (for gate/up, [M, 2I] of them).
    `acc` is int32, or on the CPU float32 holding the same integers (rounded as acc.float() rounds them)."""
    acc: torch.Tensor
    xscale: torch.Tensor
    wscale: torch.Tensor

    def dense(self) -> torch.Tensor:
        """The product in float32 (the torch kernels, which define the math): the int32 values are converted as the
        first product reads them (no float copy of their own: on the CPU every op of a small forward counts)."""
        return torch.mul(self.acc, self.xscale[:, None]).mul_(self.wscale)


def product_args(x):
    """(tensor, row scales, column scales, whether they apply) for a kernel that reads x: a float tensor or an
    Int32Product (the scales are x itself when unused: any pointer will do)."""
    if isinstance(x, Int32Product):
        return x.acc, x.xscale, x.wscale, True
    return x, x, x, False


def quantize_rows_torch(x: torch.Tensor, smooth: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 [M, K], float32 scale [M]) of x · smooth, symmetric per row."""
    t = as_dtype(x, torch.float32)
    if smooth is not None:
        t = t * smooth
    scale = t.abs().amax(-1).clamp_min_(TINY).div_(QMAX)
    # |t / scale| ≤ 127 · (1 + a few ulps) < 127.5, so the rounded values lie in [-127, 127] without a clamp (the
    # Triton kernels clamp; they agree): fewer ops, which on the CPU are most of a small forward's time
    return torch.div(t, scale[:, None]).round_().to(torch.int8), scale


def normed_output(y: torch.Tensor, out_dtype, int8):
    """A norm's or activation's float32 output as the next GEMM reads it: in out_dtype, or (int8 given: the W8A8
    input's smoothing vector, or True) quantized per row, (int8 values, float32 scales)."""
    if int8 is None:
        return as_dtype(y, out_dtype)
    return quantize_rows_torch(y, None if int8 is True else int8)


def int8_outputs(int8, like: torch.Tensor, n: int, h: int):
    """(int8 output, its row scales, the smoothing vector) for a kernel that can quantize its output, or dummies."""
    if int8 is None:
        return like, like, like
    q = torch.empty(n, h, dtype=torch.int8, device=like.device)
    return q, torch.empty(n, dtype=torch.float32, device=like.device), (like if int8 is True else int8)


if triton is not None:
    @triton.jit
    def rint(t):
        """t rounded to the nearest integer, ties to even (every step exact in float32 for |t| < 2^23)."""
        f = tl.floor(t)
        d = t - f
        odd = f - 2.0 * tl.floor(f * 0.5)
        return tl.where(d > 0.5, f + 1.0, tl.where(d < 0.5, f, f + odd))

    @triton.jit
    def store_quantized(q_row, qs_row, m_ptr, cols, mask, y, SMOOTH: tl.constexpr):
        """A row's float32 values y (× the smoothing vector) as int8 with one float32 scale: the end of every
        kernel that hands a W8A8 GEMM its input (the norms, the gated activation, quantize_rows)."""
        if SMOOTH:
            y = y * tl.load(m_ptr + cols, mask=mask, other=0.0)
        y = tl.where(mask, y, 0.0)
        scale = tl.maximum(tl.max(tl.abs(y), 0), 1e-12) / 127.0
        t = y / scale
        r = rint(t)
        r = tl.minimum(tl.maximum(r, -127.0), 127.0)
        tl.store(q_row + cols, r.to(tl.int8), mask=mask)
        tl.store(qs_row, scale)

    @triton.jit
    def _quantize_rows_kernel(x_ptr, q_ptr, qs_ptr, m_ptr, K, x_s0, SMOOTH: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < K
        x = tl.load(x_ptr + row * x_s0 + cols, mask=mask, other=0.0).to(tl.float32)
        store_quantized(q_ptr + row * K, qs_ptr + row, m_ptr, cols, mask, x, SMOOTH=SMOOTH)

    @triton.jit
    def scaled(x, xs_ptr, ws_ptr, src, cols, mask, DEQ: tl.constexpr):
        """x (float32) of row src, or, DEQ, an int32 product's values times their row's and columns' scales."""
        if DEQ:
            x = x * tl.load(xs_ptr + src) * tl.load(ws_ptr + cols, mask=mask, other=0.0)
        return x

    @triton.jit
    def _dequantize_kernel(acc_ptr, xs_ptr, ws_ptr, b_ptr, out_ptr, N, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < N
        acc = tl.load(acc_ptr + row * N + cols, mask=mask, other=0).to(tl.float32)
        y = acc * tl.load(xs_ptr + row) * tl.load(ws_ptr + cols, mask=mask, other=0.0)
        if HAS_BIAS:
            y = y + tl.load(b_ptr + cols, mask=mask, other=0.0)
        tl.store(out_ptr + row * N + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def quantize_rows(x: torch.Tensor, smooth: torch.Tensor | None, impl: str = "auto"):
    """(int8 [M, K], float32 [M]): x [M, K] (rows may be strided) · smooth, quantized per row. impl: auto, or
    torch / triton (tests)."""
    if impl == "torch" or (impl == "auto" and not use_triton(x)):
        return quantize_rows_torch(x, smooth)
    m, k = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    q = torch.empty(m, k, dtype=torch.int8, device=x.device)
    qs = torch.empty(m, dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(k)
    _quantize_rows_kernel[(m,)](x, q, qs, smooth if smooth is not None else qs, k, x.stride(0),
                                SMOOTH=smooth is not None, BLOCK=block, num_warps=4 if block <= 2048 else 8)
    return q, qs


def dequantize(acc: torch.Tensor, xscale: torch.Tensor, wscale: torch.Tensor, bias: torch.Tensor | None,
               out_dtype: torch.dtype, impl: str = "auto") -> torch.Tensor:
    """acc [M, N] int32 · xscale [M, None] · wscale [None, N] (+ bias) in out_dtype, one launch on CUDA."""
    if impl == "torch" or (impl == "auto" and not use_triton(acc)):
        y = Int32Product(acc, xscale, wscale).dense()
        return as_dtype(y if bias is None else y + bias, out_dtype)
    m, n = acc.shape
    acc = acc.contiguous()
    out = torch.empty(m, n, dtype=out_dtype, device=acc.device)
    block = 1024
    _dequantize_kernel[(m, triton.cdiv(n, block))](acc, xscale, wscale, bias if bias is not None else wscale, out, n,
                                                   HAS_BIAS=bias is not None, BLOCK=block)
    return out
