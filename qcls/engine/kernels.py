"""Fused elementwise kernels for the decoder (Triton on CUDA, plain torch elsewhere).

The unfused layer spends more time in ~30 small norm/rope/activation/copy kernels than in its GEMMs
(facts.md). These three kernels replace them: residual-add + RMSNorm, (q/k-norm +) RoPE written straight
into the attention layouts (K/V into the KV buffer), and SiLU·mul. They are elementwise/reduction work,
which Triton runs on sm_75 without tensor cores; the GEMMs stay on cuBLAS. The torch versions define the
math and are what CPU runs use; GPU tests hold the Triton versions to them.
"""
from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs
    triton = None


def use_triton(x: torch.Tensor) -> bool:
    return triton is not None and x.is_cuda


# ---- residual add + RMSNorm --------------------------------------------------------------------------
def add_rmsnorm_torch(x, residual, weight, eps):
    if residual is not None:
        x = x + residual
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return weight * y, x


if triton is not None:
    @triton.jit
    def _add_rmsnorm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, s_ptr, H, eps, HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < H
        x = tl.load(x_ptr + row * H + cols, mask=m, other=0.0)
        if HAS_RES:
            x = x + tl.load(r_ptr + row * H + cols, mask=m, other=0.0)
            tl.store(s_ptr + row * H + cols, x, mask=m)
        xf = x.to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / H + eps)
        y = (xf * inv).to(x.dtype)
        w = tl.load(w_ptr + cols, mask=m, other=0.0)
        tl.store(y_ptr + row * H + cols, w * y, mask=m)


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    """(RMSNorm(x + residual) * weight, x + residual), as transformers' Llama/Qwen RMSNorm computes it."""
    if not use_triton(x):
        return add_rmsnorm_torch(x, residual, weight, eps)
    n, h = x.shape
    y = torch.empty_like(x)
    s = torch.empty_like(x) if residual is not None else x
    _add_rmsnorm_kernel[(n,)](x, residual if residual is not None else x, weight, y, s, h, eps,
                              HAS_RES=residual is not None, BLOCK=triton.next_power_of_2(h))
    return y, s


# ---- (q/k norm +) RoPE into the attention layouts -----------------------------------------------------
def rope_torch(x, cos, sin, norm_w, eps):
    """x [N, heads, d]; cos/sin [N, d]; optional per-head RMSNorm (Qwen3) before the rotation."""
    if norm_w is not None:
        x, _ = add_rmsnorm_torch(x, None, norm_w, eps)
    h = x.shape[-1] // 2
    c, s = cos[:, None], sin[:, None]
    return x * c + torch.cat([-x[..., h:], x[..., :h]], -1) * s


if triton is not None:
    @triton.jit
    def _rope_kernel(x_ptr, cos_ptr, sin_ptr, w_ptr, out_ptr, x_s0, x_s1, o_s0, o_s1, eps,
                     D: tl.constexpr, HAS_NORM: tl.constexpr):
        t = tl.program_id(0)
        hd = tl.program_id(1)
        half: tl.constexpr = D // 2
        i = tl.arange(0, half)
        base = x_ptr + t * x_s0 + hd * x_s1
        x1 = tl.load(base + i)
        x2 = tl.load(base + half + i)
        if HAS_NORM:
            f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
            inv = 1.0 / tl.sqrt((tl.sum(f1 * f1, 0) + tl.sum(f2 * f2, 0)) / D + eps)
            x1 = tl.load(w_ptr + i) * (f1 * inv).to(x1.dtype)
            x2 = tl.load(w_ptr + half + i) * (f2 * inv).to(x2.dtype)
        c1 = tl.load(cos_ptr + t * D + i)
        c2 = tl.load(cos_ptr + t * D + half + i)
        s1 = tl.load(sin_ptr + t * D + i)
        s2 = tl.load(sin_ptr + t * D + half + i)
        ob = out_ptr + t * o_s0 + hd * o_s1
        tl.store(ob + i, x1 * c1 - x2 * s1)
        tl.store(ob + half + i, x2 * c2 + x1 * s2)


def rope_into(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, norm_w: torch.Tensor | None, eps: float,
              out: torch.Tensor) -> None:
    """Write rope(norm(x)) for x [N, heads, d] into `out`, any view indexable as [N, heads, d] (e.g. the
    K buffer's slots for these tokens, or the queries in SDPA's layout)."""
    if not use_triton(x):
        out.copy_(rope_torch(x, cos, sin, norm_w, eps))
        return
    n, heads, d = x.shape
    _rope_kernel[(n, heads)](x, cos, sin, norm_w if norm_w is not None else x, out, x.stride(0), x.stride(1),
                             out.stride(0), out.stride(1), eps, D=d, HAS_NORM=norm_w is not None)


# ---- SwiGLU activation --------------------------------------------------------------------------------
if triton is not None:
    @triton.jit
    def _silu_mul_kernel(gu_ptr, out_ptr, I, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = cols < I
        g = tl.load(gu_ptr + row * 2 * I + cols, mask=m, other=0.0).to(tl.float32)
        u = tl.load(gu_ptr + row * 2 * I + I + cols, mask=m, other=0.0)
        a = (g / (1.0 + tl.exp(-g))).to(u.dtype)
        tl.store(out_ptr + row * I + cols, a * u, mask=m)


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gu = [gate | up] along the last dim."""
    i = gu.shape[-1] // 2
    if not use_triton(gu):
        return torch.nn.functional.silu(gu[..., :i]) * gu[..., i:]
    out = torch.empty(gu.shape[0], i, dtype=gu.dtype, device=gu.device)
    block = 1024
    _silu_mul_kernel[(gu.shape[0], triton.cdiv(i, block))](gu, out, i, BLOCK=block)
    return out
