"""BENCHMARK BASELINE ONLY: the decoder's elementwise kernels as they were before issue 18 (residual stream and
every elementwise step in the model's dtype), kept so bench/paired.py --legacy-kernels can time the float32
residual stream against them in one process. Not imported by qcls.

Fused elementwise kernels for the decoder (Triton on CUDA, plain torch elsewhere).

The unfused layer spends more time in ~30 small norm/rope/activation/copy kernels than in its GEMMs
(facts.md). These three kernels replace them: residual-add + RMSNorm, (q/k-norm +) RoPE of queries and keys with the
K/V written straight into the KV buffer (one launch per layer), and SiLU·mul. They are elementwise/reduction work,
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
    def _load_head(src, w_ptr, eps, D: tl.constexpr, HAS_NORM: tl.constexpr):
        """One head's two halves, RMS-normed by w (Qwen3's q/k norm) when HAS_NORM."""
        half: tl.constexpr = D // 2
        i = tl.arange(0, half)
        x1 = tl.load(src + i)
        x2 = tl.load(src + half + i)
        if HAS_NORM:
            f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
            inv = 1.0 / tl.sqrt((tl.sum(f1 * f1, 0) + tl.sum(f2 * f2, 0)) / D + eps)
            x1 = tl.load(w_ptr + i) * (f1 * inv).to(x1.dtype)
            x2 = tl.load(w_ptr + half + i) * (f2 * inv).to(x2.dtype)
        return x1, x2

    @triton.jit
    def _qkv_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, qo_ptr, kb_ptr, vb_ptr, slot_ptr,
                    q_s0, k_s0, v_s0, qo_s0, kb_s_head, eps, NH: tl.constexpr, D: tl.constexpr,
                    HAS_NORM: tl.constexpr):
        """Program (token t, head hd): hd < NH rotates query head hd into the query buffer; otherwise it
        rotates key head hd-NH into the K buffer at the token's slot and copies the value head beside it."""
        t = tl.program_id(0)
        hd = tl.program_id(1)
        half: tl.constexpr = D // 2
        i = tl.arange(0, half)
        c1 = tl.load(cos_ptr + t * D + i)
        c2 = tl.load(cos_ptr + t * D + half + i)
        s1 = tl.load(sin_ptr + t * D + i)
        s2 = tl.load(sin_ptr + t * D + half + i)
        if hd < NH:
            x1, x2 = _load_head(q_ptr + t * q_s0 + hd * D, qw_ptr, eps, D, HAS_NORM)
            tl.store(qo_ptr + t * qo_s0 + hd * D + i, x1 * c1 - x2 * s1)
            tl.store(qo_ptr + t * qo_s0 + hd * D + half + i, x2 * c2 + x1 * s2)
        else:
            kh = hd - NH
            slot = tl.load(slot_ptr + t)
            x1, x2 = _load_head(k_ptr + t * k_s0 + kh * D, kw_ptr, eps, D, HAS_NORM)
            kd = kb_ptr + kh * kb_s_head + slot * D
            tl.store(kd + i, x1 * c1 - x2 * s1)
            tl.store(kd + half + i, x2 * c2 + x1 * s2)
            vd = vb_ptr + kh * kb_s_head + slot * D
            tl.store(vd + i, tl.load(v_ptr + t * v_s0 + kh * D + i))
            tl.store(vd + half + i, tl.load(v_ptr + t * v_s0 + kh * D + half + i))


def qkv_into(qp: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             qw: torch.Tensor | None, kw: torch.Tensor | None, eps: float, q_out: torch.Tensor,
             kbuf: torch.Tensor, vbuf: torch.Tensor, slots: torch.Tensor, impl: str = "auto") -> None:
    """One launch per layer for everything between the QKV GEMM and attention: (q/k norm +) RoPE of the
    queries into `q_out` [N, heads, d], of the keys into the K buffer [kv_heads, slots, d] at `slots`, and
    the values copied beside them. qp/kp/vp are [N, heads, d] views (e.g. splits of the fused GEMM).
    impl: auto (Triton on CUDA), or torch / triton to pick one (tests)."""
    if impl == "torch" or (impl == "auto" and not use_triton(qp)):
        q_out.copy_(rope_torch(qp, cos, sin, qw, eps))
        kbuf[:, slots] = rope_torch(kp, cos, sin, kw, eps).transpose(0, 1)
        vbuf[:, slots] = vp.transpose(0, 1)
        return
    n, nh, d = qp.shape
    nkv = kp.shape[1]
    if any(x.stride(2) != 1 or x.stride(1) != d for x in (qp, kp, vp)):
        raise ValueError("qkv_into needs each head's d values contiguous")
    _qkv_kernel[(n, nh + nkv)](qp, kp, vp, cos, sin, qw if qw is not None else qp, kw if kw is not None else kp,
                               q_out, kbuf, vbuf, slots, qp.stride(0), kp.stride(0), vp.stride(0),
                               q_out.stride(0), kbuf.stride(0), eps, NH=nh, D=d, HAS_NORM=qw is not None)


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
