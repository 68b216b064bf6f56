"""Fused elementwise kernels for the decoder (Triton on CUDA, plain torch elsewhere).

The unfused layer spends more time in ~30 small norm/rope/activation/copy kernels than in its GEMMs
(facts.md). These kernels replace them: residual-add + RMSNorm, (q/k-norm +) RoPE of queries and keys with the
K/V written straight into the KV buffer (one launch per layer), and the gated activation (SiLU·mul for
Llama/Qwen, GELU-tanh·mul for Gemma3). The norms take `offset`: Gemma3's RMSNorm multiplies by (1 + w), the
others by w (both in float32 here). They are elementwise/reduction work,
which Triton runs on sm_75 without tensor cores; the GEMMs stay on cuBLAS. The torch versions define the
math and are what CPU runs use; GPU tests hold the Triton versions to them.

Precision (issue 18): the residual stream is kept in float32 across layers, and every elementwise step
(norm × weight, q/k norm, rotation, activation × up) is computed in float32 and rounded to the model's dtype
once, where the next GEMM reads it. transformers' fp16 forward rounds the residual after every layer and each
of those steps separately; those roundings compound over 36 layers. The extra bytes are [tokens, hidden]
float32 per layer, nothing beside the weights.
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
def add_rmsnorm_torch(x, residual, weight, eps, out_dtype=None, offset: bool = False):
    """(RMSNorm(x + residual) · weight (1 + weight with `offset`) in out_dtype (default x's), x + residual in
    float32)."""
    s = x.float() if residual is None else x.float() + residual.float()
    y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * (weight.float() + 1.0 if offset else weight.float())
    return y.to(out_dtype or x.dtype), s


if triton is not None:
    @triton.jit
    def _add_rmsnorm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, s_ptr, H, eps, HAS_RES: tl.constexpr, OFFSET: tl.constexpr,
                            BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < H
        x = tl.load(x_ptr + row * H + cols, mask=m, other=0.0).to(tl.float32)
        if HAS_RES:
            x = x + tl.load(r_ptr + row * H + cols, mask=m, other=0.0)
        tl.store(s_ptr + row * H + cols, x, mask=m)
        inv = 1.0 / tl.sqrt(tl.sum(x * x, 0) / H + eps)
        w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
        if OFFSET:
            w = w + 1.0
        tl.store(y_ptr + row * H + cols, (x * inv * w).to(y_ptr.dtype.element_ty), mask=m)


def norm_warps(h: int) -> int:
    """Warps per row of the norm kernel: on an H100 (bench/RESULTS.md, "norm kernel: … per warps setting") 16 warps
    were the fastest at hidden 2560 and 4096 (3-7 % over 4); Triton's default 4 below 1024."""
    return 4 if h <= 1024 else 8 if h <= 2048 else 16


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
                out_dtype: torch.dtype | None = None, offset: bool = False):
    """(RMSNorm(x + residual) · weight, x + residual): the residual stream (`residual`, and the sum returned)
    in float32; the normed output in `out_dtype` (default x's: what the next GEMM reads). `offset`: Gemma3's
    RMSNorm, × (1 + weight)."""
    if not use_triton(x):
        return add_rmsnorm_torch(x, residual, weight, eps, out_dtype, offset)
    n, h = x.shape
    y = torch.empty(n, h, dtype=out_dtype or x.dtype, device=x.device)
    s = torch.empty(n, h, dtype=torch.float32, device=x.device)
    _add_rmsnorm_kernel[(n,)](x, residual if residual is not None else s, weight, y, s, h, eps,
                              HAS_RES=residual is not None, OFFSET=offset, BLOCK=triton.next_power_of_2(h),
                              num_warps=norm_warps(h))
    return y, s


# ---- (q/k norm +) RoPE into the attention layouts -----------------------------------------------------
def rope_torch(x, cos, sin, norm_w, eps, offset: bool = False):
    """x [N, heads, d]; cos/sin [N, d]; optional per-head RMSNorm (Qwen3; Gemma3's × (1 + w) with `offset`)
    before the rotation; float32 throughout, rounded to x's dtype once."""
    f = x.float()
    if norm_w is not None:
        f = f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + eps) * (norm_w.float() + 1.0 if offset else norm_w.float())
    h = f.shape[-1] // 2
    c, s = cos.float()[:, None], sin.float()[:, None]
    return (f * c + torch.cat([-f[..., h:], f[..., :h]], -1) * s).to(x.dtype)


if triton is not None:
    @triton.jit
    def _load_head(src, w_ptr, eps, D: tl.constexpr, HAS_NORM: tl.constexpr, OFFSET: tl.constexpr):
        """One head's two halves in float32, RMS-normed by w (Qwen3's q/k norm; Gemma3's by 1 + w with OFFSET)
        when HAS_NORM."""
        half: tl.constexpr = D // 2
        i = tl.arange(0, half)
        x1 = tl.load(src + i).to(tl.float32)
        x2 = tl.load(src + half + i).to(tl.float32)
        if HAS_NORM:
            inv = 1.0 / tl.sqrt((tl.sum(x1 * x1, 0) + tl.sum(x2 * x2, 0)) / D + eps)
            w1 = tl.load(w_ptr + i).to(tl.float32)
            w2 = tl.load(w_ptr + half + i).to(tl.float32)
            if OFFSET:
                w1 = w1 + 1.0
                w2 = w2 + 1.0
            x1 = w1 * x1 * inv
            x2 = w2 * x2 * inv
        return x1, x2

    @triton.jit
    def _qkv_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, qo_ptr, kb_ptr, vb_ptr, slot_ptr,
                    q_s0, k_s0, v_s0, qo_s0, kb_s_head, eps, NH: tl.constexpr, D: tl.constexpr,
                    HAS_NORM: tl.constexpr, OFFSET: tl.constexpr):
        """Program (token t, head hd): hd < NH rotates query head hd into the query buffer; otherwise it
        rotates key head hd-NH into the K buffer at the token's slot and copies the value head beside it."""
        t = tl.program_id(0)
        hd = tl.program_id(1)
        half: tl.constexpr = D // 2
        i = tl.arange(0, half)
        c1 = tl.load(cos_ptr + t * D + i).to(tl.float32)
        c2 = tl.load(cos_ptr + t * D + half + i).to(tl.float32)
        s1 = tl.load(sin_ptr + t * D + i).to(tl.float32)
        s2 = tl.load(sin_ptr + t * D + half + i).to(tl.float32)
        # (dtypes are written inline: a non-tensor assigned in both branches of a runtime `if` does not compile)
        if hd < NH:
            x1, x2 = _load_head(q_ptr + t * q_s0 + hd * D, qw_ptr, eps, D, HAS_NORM, OFFSET)
            tl.store(qo_ptr + t * qo_s0 + hd * D + i, (x1 * c1 - x2 * s1).to(qo_ptr.dtype.element_ty))
            tl.store(qo_ptr + t * qo_s0 + hd * D + half + i, (x2 * c2 + x1 * s2).to(qo_ptr.dtype.element_ty))
        else:
            kh = hd - NH
            slot = tl.load(slot_ptr + t)
            x1, x2 = _load_head(k_ptr + t * k_s0 + kh * D, kw_ptr, eps, D, HAS_NORM, OFFSET)
            kd = kb_ptr + kh * kb_s_head + slot * D
            tl.store(kd + i, (x1 * c1 - x2 * s1).to(kb_ptr.dtype.element_ty))
            tl.store(kd + half + i, (x2 * c2 + x1 * s2).to(kb_ptr.dtype.element_ty))
            vd = vb_ptr + kh * kb_s_head + slot * D
            tl.store(vd + i, tl.load(v_ptr + t * v_s0 + kh * D + i))
            tl.store(vd + half + i, tl.load(v_ptr + t * v_s0 + kh * D + half + i))


if triton is not None:
    @triton.jit
    def _qkv_heads_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, qo_ptr, kb_ptr, vb_ptr, slot_ptr,
                          q_s0, k_s0, v_s0, qo_s0, kb_s_head, eps, NH: tl.constexpr, D: tl.constexpr,
                          HB: tl.constexpr, HAS_NORM: tl.constexpr, OFFSET: tl.constexpr):
        """_qkv_kernel with HB heads per program (issue 27): program (token t, group g) does query heads
        g·HB … g·HB + HB - 1, or, past the query heads, that group of key heads (and their values). One token's
        cos/sin and norm weights are read once for HB heads, and there are HB× fewer programs: the one-head
        kernel ran at 4-10× its bytes' time on an H100 (0.21 ms of a 126-token forward, 0.55 ms at 440).
        NH and the key heads are multiples of HB."""
        t = tl.program_id(0)
        g = tl.program_id(1)
        half: tl.constexpr = D // 2
        i = tl.arange(0, half)[None, :]
        h = tl.arange(0, HB)[:, None]
        c1 = tl.load(cos_ptr + t * D + i).to(tl.float32)
        c2 = tl.load(cos_ptr + t * D + half + i).to(tl.float32)
        s1 = tl.load(sin_ptr + t * D + i).to(tl.float32)
        s2 = tl.load(sin_ptr + t * D + half + i).to(tl.float32)
        if g * HB < NH:
            src = q_ptr + t * q_s0 + (g * HB + h) * D
            x1 = tl.load(src + i).to(tl.float32)
            x2 = tl.load(src + half + i).to(tl.float32)
            if HAS_NORM:
                inv = 1.0 / tl.sqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / D + eps)[:, None]
                w1 = tl.load(qw_ptr + i).to(tl.float32)
                w2 = tl.load(qw_ptr + half + i).to(tl.float32)
                if OFFSET:
                    w1 = w1 + 1.0
                    w2 = w2 + 1.0
                x1 = w1 * x1 * inv
                x2 = w2 * x2 * inv
            dst = qo_ptr + t * qo_s0 + (g * HB + h) * D
            tl.store(dst + i, (x1 * c1 - x2 * s1).to(qo_ptr.dtype.element_ty))
            tl.store(dst + half + i, (x2 * c2 + x1 * s2).to(qo_ptr.dtype.element_ty))
        else:
            kh = g * HB - NH + h
            slot = tl.load(slot_ptr + t)
            src = k_ptr + t * k_s0 + kh * D
            x1 = tl.load(src + i).to(tl.float32)
            x2 = tl.load(src + half + i).to(tl.float32)
            if HAS_NORM:
                inv = 1.0 / tl.sqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / D + eps)[:, None]
                w1 = tl.load(kw_ptr + i).to(tl.float32)
                w2 = tl.load(kw_ptr + half + i).to(tl.float32)
                if OFFSET:
                    w1 = w1 + 1.0
                    w2 = w2 + 1.0
                x1 = w1 * x1 * inv
                x2 = w2 * x2 * inv
            kd = kb_ptr + kh * kb_s_head + slot * D
            tl.store(kd + i, (x1 * c1 - x2 * s1).to(kb_ptr.dtype.element_ty))
            tl.store(kd + half + i, (x2 * c2 + x1 * s2).to(kb_ptr.dtype.element_ty))
            vs = v_ptr + t * v_s0 + kh * D
            vd = vb_ptr + kh * kb_s_head + slot * D
            tl.store(vd + i, tl.load(vs + i))
            tl.store(vd + half + i, tl.load(vs + half + i))


def qkv_heads_per_program(nh: int, nkv: int, wanted: int = 0) -> int:
    """Heads per program of the q/k/v kernel: `wanted` if it divides both head counts (1: the one-head
    kernel), else, for 0 (auto), the largest power of two ≤ 8 that does."""
    if wanted:
        if nh % wanted or nkv % wanted or wanted & (wanted - 1):
            raise ValueError(f"engine.qkv_heads_per_program={wanted} must be a power of two dividing the "
                             f"{nh} query and {nkv} key/value heads; use 0 (auto) or 1")
        return wanted
    return max(hb for hb in (1, 2, 4, 8) if nh % hb == 0 and nkv % hb == 0)


def qkv_into(qp: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             qw: torch.Tensor | None, kw: torch.Tensor | None, eps: float, q_out: torch.Tensor,
             kbuf: torch.Tensor, vbuf: torch.Tensor, slots: torch.Tensor, impl: str = "auto",
             offset: bool = False, heads_per_program: int = 1) -> None:
    """One launch per layer for everything between the QKV GEMM and attention: (q/k norm +) RoPE of the
    queries into `q_out` [N, heads, d], of the keys into the K buffer [kv_heads, slots, d] at `slots`, and
    the values copied beside them. qp/kp/vp are [N, heads, d] views (e.g. splits of the fused GEMM).
    impl: auto (Triton on CUDA), or torch / triton to pick one (tests). `offset`: Gemma3's q/k norms.
    `heads_per_program` (qkv_heads_per_program): 1 runs the one-head kernel, more the blocked one."""
    if impl == "torch" or (impl == "auto" and not use_triton(qp)):
        q_out.copy_(rope_torch(qp, cos, sin, qw, eps, offset))
        kbuf[:, slots] = rope_torch(kp, cos, sin, kw, eps, offset).transpose(0, 1)
        vbuf[:, slots] = vp.transpose(0, 1)
        return
    n, nh, d = qp.shape
    nkv = kp.shape[1]
    if any(x.stride(2) != 1 or x.stride(1) != d for x in (qp, kp, vp)):
        raise ValueError("qkv_into needs each head's d values contiguous")
    args = (qp, kp, vp, cos, sin, qw if qw is not None else qp, kw if kw is not None else kp, q_out, kbuf, vbuf,
            slots, qp.stride(0), kp.stride(0), vp.stride(0), q_out.stride(0), kbuf.stride(0), eps)
    hb = heads_per_program
    if hb > 1:
        if nh % hb or nkv % hb:
            raise ValueError(f"{hb} heads per program must divide {nh} query and {nkv} key/value heads")
        _qkv_heads_kernel[(n, (nh + nkv) // hb)](*args, NH=nh, D=d, HB=hb, HAS_NORM=qw is not None, OFFSET=offset)
    else:
        _qkv_kernel[(n, nh + nkv)](*args, NH=nh, D=d, HAS_NORM=qw is not None, OFFSET=offset)


# ---- gated activation: SiLU·mul (Llama/Qwen), GELU-tanh·mul (Gemma3) ------------------------------------
if triton is not None:
    @triton.jit
    def _act_mul_kernel(g_ptr, u_ptr, out_ptr, I, g_s0, u_s0, GELU: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = cols < I
        g = tl.load(g_ptr + row * g_s0 + cols, mask=m, other=0.0).to(tl.float32)
        u = tl.load(u_ptr + row * u_s0 + cols, mask=m, other=0.0).to(tl.float32)
        if GELU:  # 0.5·g·(1 + tanh(z)) = g·sigmoid(2z), z = √(2/π)·(g + 0.044715·g³)
            z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
            a = g / (1.0 + tl.exp(-2.0 * z))
        else:
            a = g / (1.0 + tl.exp(-g))
        tl.store(out_ptr + row * I + cols, (a * u).to(out_ptr.dtype.element_ty), mask=m)


def act_mul(g: torch.Tensor, u: torch.Tensor, gelu: bool) -> torch.Tensor:
    """act(g) * u for [N, I] gate and up (rows may be strided, e.g. the halves of one fused GEMM's output),
    float32 inside, rounded once. Modules that run gate and up as two GEMMs (quantized or streamed linears)
    come here too, so their activation rounds as the fused path's does (transformers' MLP rounds act(g)
    and the product separately)."""
    if not use_triton(g):
        f = g.float()
        a = torch.nn.functional.gelu(f, approximate="tanh") if gelu else torch.nn.functional.silu(f)
        return (a * u.float()).to(g.dtype)
    if g.stride(-1) != 1 or u.stride(-1) != 1:
        raise ValueError("act_mul needs unit stride along the intermediate dim")
    n, i = g.shape
    out = torch.empty(n, i, dtype=g.dtype, device=g.device)
    block = 1024
    _act_mul_kernel[(n, triton.cdiv(i, block))](g, u, out, i, g.stride(0), u.stride(0), GELU=gelu, BLOCK=block)
    return out


def _act_mul(gu: torch.Tensor, gelu: bool) -> torch.Tensor:
    i = gu.shape[-1] // 2
    return act_mul(gu[..., :i], gu[..., i:], gelu)


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gu = [gate | up] along the last dim (float32 inside, one rounding)."""
    return _act_mul(gu, gelu=False)


def gelu_tanh_mul(gu: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(gate) * up for gu = [gate | up] (transformers' gelu_pytorch_tanh), float32 inside."""
    return _act_mul(gu, gelu=True)
