"""(q/k norm +) RoPE of queries and keys into the attention layouts, K/V written straight into the KV buffer:
everything between the QKV GEMM and attention in one launch per layer (Triton on CUDA, torch elsewhere; the
precision rules of qcls/engine/kernels.py: float32 inside, rounded once)."""
from __future__ import annotations

import torch

from qcls.engine.kernels import F32, as_dtype, triton, use_triton

if triton is not None:
    import triton.language as tl
else:
    rope_values = rope_inputs = rope_apply = None


def rope_torch(x, cos, sin, norm_w, eps, offset: bool = False):
    """x [N, heads, d]; cos/sin [N, d]; optional per-head RMSNorm (Qwen3; Gemma3's × (1 + w) with `offset`)
    before the rotation; float32 throughout, rounded to x's dtype once."""
    f = as_dtype(x, F32)
    if norm_w is not None:
        w = as_dtype(norm_w, F32)
        f = f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + eps) * (w + 1.0 if offset else w)
    h = f.shape[-1] // 2
    c, s = as_dtype(cos, F32)[:, None], as_dtype(sin, F32)[:, None]
    return as_dtype(f * c + torch.cat([-f[..., h:], f[..., :h]], -1) * s, x.dtype)


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
            w1 = tl.load(w_ptr + i).to(tl.float32)
            w2 = tl.load(w_ptr + half + i).to(tl.float32)
            inv = 1.0 / tl.sqrt((tl.sum(x1 * x1, 0) + tl.sum(x2 * x2, 0)) / D + eps)
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
    def _normed(x1, x2, w_ptr, i, eps, D: tl.constexpr, OFFSET: tl.constexpr):
        """Rows of heads as their two halves x1, x2 [R, D/2] (float32), RMS-normed by w (Qwen3's q/k norm;
        Gemma3's by 1 + w with OFFSET); `i` [1, D/2] the column indices of a half."""
        half: tl.constexpr = D // 2
        w1 = tl.load(w_ptr + i).to(tl.float32)  # loads before the reduction (kernels.py: one round trip, not two)
        w2 = tl.load(w_ptr + half + i).to(tl.float32)
        inv = 1.0 / tl.sqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / D + eps)[:, None]
        if OFFSET:
            w1 = w1 + 1.0
            w2 = w2 + 1.0
        return w1 * x1 * inv, w2 * x2 * inv

    @triton.jit
    def _qkv_heads_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, qo_ptr, kb_ptr, vb_ptr, slot_ptr,
                          q_s0, k_s0, v_s0, qo_s0, kb_s_head, eps, NH: tl.constexpr, D: tl.constexpr,
                          HB: tl.constexpr, HAS_NORM: tl.constexpr, OFFSET: tl.constexpr):
        """_qkv_kernel with HB heads per program (the blocked q/k/v kernel): program (token t, group g) does query heads
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
                x1, x2 = _normed(x1, x2, qw_ptr, i, eps, D, OFFSET)
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
                x1, x2 = _normed(x1, x2, kw_ptr, i, eps, D, OFFSET)
            kd = kb_ptr + kh * kb_s_head + slot * D
            tl.store(kd + i, (x1 * c1 - x2 * s1).to(kb_ptr.dtype.element_ty))
            tl.store(kd + half + i, (x2 * c2 + x1 * s2).to(kb_ptr.dtype.element_ty))
            vs = v_ptr + t * v_s0 + kh * D
            vd = vb_ptr + kh * kb_s_head + slot * D
            tl.store(vd + i, tl.load(vs + i))
            tl.store(vd + half + i, tl.load(vs + half + i))


if triton is not None:
    @triton.jit
    def rope_inputs(src, ok, tok, cos_ptr, sin_ptr, w_ptr, D: tl.constexpr, HAS_NORM: tl.constexpr):
        """Every load rope_values needs, nothing computed (a kernel may issue them early and compute later): the rows'
        two halves [R, D/2] in float32, their tokens' cos/sin halves and the norm weight's halves [1, D/2] (without
        HAS_NORM, placeholders)."""
        half: tl.constexpr = D // 2
        i = tl.arange(0, half)[None, :]
        m = ok[:, None]
        x1 = tl.load(src[:, None] + i, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(src[:, None] + half + i, mask=m, other=0.0).to(tl.float32)
        row = tok[:, None] * D  # cos/sin loaded before the norm's reduction, as its weights are (_normed)
        c1 = tl.load(cos_ptr + row + i, mask=m, other=0.0).to(tl.float32)
        c2 = tl.load(cos_ptr + row + half + i, mask=m, other=0.0).to(tl.float32)
        s1 = tl.load(sin_ptr + row + i, mask=m, other=0.0).to(tl.float32)
        s2 = tl.load(sin_ptr + row + half + i, mask=m, other=0.0).to(tl.float32)
        if HAS_NORM:
            w1 = tl.load(w_ptr + i).to(tl.float32)
            w2 = tl.load(w_ptr + half + i).to(tl.float32)
        else:
            w1, w2 = c1, c2
        return x1, x2, c1, c2, s1, s2, w1, w2

    @triton.jit
    def rope_apply(x1, x2, c1, c2, s1, s2, w1, w2, eps, D: tl.constexpr, HAS_NORM: tl.constexpr,
                   OFFSET: tl.constexpr):
        """rope_values' arithmetic on rope_inputs' values: (RMS-norm by w, Gemma3's 1 + w with OFFSET, then) rotate."""
        if HAS_NORM:
            inv = 1.0 / tl.sqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / D + eps)[:, None]
            if OFFSET:
                w1 = w1 + 1.0
                w2 = w2 + 1.0
            x1 = w1 * x1 * inv
            x2 = w2 * x2 * inv
        return x1 * c1 - x2 * s1, x2 * c2 + x1 * s2

    @triton.jit
    def rope_values(src, ok, tok, cos_ptr, sin_ptr, w_ptr, eps, D: tl.constexpr, HAS_NORM: tl.constexpr,
                    OFFSET: tl.constexpr):
        """_qkv_heads_kernel's arithmetic for a block of rows, inside another kernel (the fused q/k/v: the tree
        attention, engine.fuse_qkv_attention): `src` [R] points at each row's head (D values), `tok` [R] its token
        (a row of the forward's cos/sin [tokens, D]); returns the rotated halves [R, D/2] in float32 (rows where
        `ok` is false read nothing and come out 0)."""
        x1, x2, c1, c2, s1, s2, w1, w2 = rope_inputs(src, ok, tok, cos_ptr, sin_ptr, w_ptr, D, HAS_NORM)
        return rope_apply(x1, x2, c1, c2, s1, s2, w1, w2, eps, D, HAS_NORM, OFFSET)


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
