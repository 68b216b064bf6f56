"""Fused elementwise kernels for the decoder (Triton on CUDA, plain torch elsewhere).

The unfused layer spends more time in ~30 small norm/rope/activation/copy kernels than in its GEMMs
(facts.md). These kernels replace them: residual-add + RMSNorm (and Gemma3's post-norm before it), (q/k-norm +)
RoPE of queries and keys with the K/V written straight into the KV buffer (one launch per layer:
qcls/engine/qkv_kernels.py), and the gated activation (SiLU·mul for
Llama/Qwen, GELU-tanh·mul for Gemma3). The norms take `offset`: Gemma3's RMSNorm multiplies by (1 + w), the
others by w (both in float32 here). They are elementwise/reduction work,
which Triton runs on sm_75 without tensor cores; the GEMMs stay on cuBLAS. The torch versions define the
math and are what CPU runs use; GPU tests hold the Triton versions to them.

Precision: the residual stream is kept in float32 across layers, and every elementwise step
(norm × weight, q/k norm, rotation, activation × up) is computed in float32 and rounded to the model's dtype
once, where the next GEMM reads it. transformers' fp16 forward rounds the residual after every layer and each
of those steps separately; those roundings compound over 36 layers. The extra bytes are [tokens, hidden]
float32 per layer, nothing beside the weights.
"""
from __future__ import annotations

import functools

import torch

from qcls.engine.int8_kernels import Int32Product, as_dtype, int8_outputs, normed_output, product_args

F32 = torch.float32

try:
    import triton
    import triton.language as tl
    from qcls.engine.int8_kernels import scaled, store_quantized
except ImportError:  # CPU-only installs
    triton = None


def use_triton(x: torch.Tensor) -> bool:
    return triton is not None and x.is_cuda


# None: residual_hints decides; True / False: forced (tests)
RESIDUAL_HINTS: bool | None = None


def residual_hints(x: torch.Tensor, rows: int) -> bool:
    """Whether the norms give the L2 eviction hints (their float32 residual loaded and stored evict_last, the normed
    input loaded evict_first): on sm_80+ (the L2 policies; sm_75 has none) while the residual stream, rows × hidden
    float32, is at most a quarter of the L2. Between two norms the GEMMs stream their weights through the L2; the hint
    keeps the residual there for the next norm. H100 (50 MB L2), Qwen3-4B / Gemma3-4B layer chains (GEMMs, these norms
    and the activation, in alternation): the norms 5-15 % faster at 126 and 440 rows (1.3-4.5 MB of residual), the
    chains 0.07-0.15 ms faster at 126 rows and -0.08 to +0.04 ms at 440 (the GEMMs' own spread between runs); at 1760
    rows (18 MB) the norms gained 2-4 % and the GEMMs lost as much or more (the layer chains timed alone,
    bench/RESULTS.md)."""
    if RESIDUAL_HINTS is not None:
        return RESIDUAL_HINTS
    if not x.is_cuda:
        return False
    return _l2_budget(x.device.index if x.device.index is not None else torch.cuda.current_device()) >= \
        rows * x.shape[-1] * 4


@functools.lru_cache(maxsize=None)
def _l2_budget(index: int) -> int:
    """A quarter of the device's L2 in bytes where it has L2 eviction policies (sm_80+), else 0."""
    if torch.cuda.get_device_capability(index) < (8, 0):
        return 0
    return getattr(torch.cuda.get_device_properties(index), "L2_cache_size", 0) // 4


if triton is not None:
    @triton.jit
    def _load_hinted(ptr, m, HINT: tl.constexpr, LAST: tl.constexpr):
        """ptr's values (0 where masked); with HINT an L2 eviction hint: evict_last (LAST) or evict_first."""
        if HINT:
            if LAST:
                return tl.load(ptr, mask=m, other=0.0, eviction_policy="evict_last")
            else:
                return tl.load(ptr, mask=m, other=0.0, eviction_policy="evict_first")
        else:
            return tl.load(ptr, mask=m, other=0.0)

    @triton.jit
    def _store_residual(ptr, v, m, HINT: tl.constexpr):
        if HINT:
            tl.store(ptr, v, mask=m, eviction_policy="evict_last")
        else:
            tl.store(ptr, v, mask=m)


# ---- residual add + RMSNorm --------------------------------------------------------------------------
def add_rmsnorm_torch(x, residual, weight, eps, out_dtype=None, offset: bool = False, rows=None, scale=None,
                      int8=None):
    """(RMSNorm(x + residual) · weight (1 + weight with `offset`) in out_dtype (default x's), x + residual in
    float32); `rows`: only these rows of x and residual, in this order; `scale`: x × scale first, rounded to x's
    dtype (Gemma3's scaled embedding: its module's arithmetic); `int8`: the output quantized (int8_kernels.normed_output).
    x may be an Int32Product (a W8A8 linear's output before its scales)."""
    if isinstance(x, Int32Product):
        x = x.dense()
    if rows is not None:
        x, residual = x[rows], (residual[rows] if residual is not None else None)
    if scale is not None:
        x = x * torch.tensor(scale, dtype=x.dtype)
    s = as_dtype(x, F32) if residual is None else as_dtype(x, F32) + as_dtype(residual, F32)
    w = as_dtype(weight, F32)
    y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * (w + 1.0 if offset else w)
    return normed_output(y, out_dtype or x.dtype, int8), s


if triton is not None:
    @triton.jit
    def _add_rmsnorm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, s_ptr, rows_ptr, qs_ptr, m_ptr, xs_ptr, ws_ptr, H, eps, scale,
                            HAS_RES: tl.constexpr, OFFSET: tl.constexpr, GATHER: tl.constexpr, SCALE: tl.constexpr,
                            BLOCK: tl.constexpr, HINT: tl.constexpr, INT8: tl.constexpr, SMOOTH: tl.constexpr,
                            DEQ: tl.constexpr):
        row = tl.program_id(0)
        src = tl.load(rows_ptr + row) if GATHER else row  # GATHER: output row i reads input row rows[i]
        cols = tl.arange(0, BLOCK)
        m = cols < H
        x = _load_hinted(x_ptr + src * H + cols, m, HINT, False)  # HINT: residual_hints
        if SCALE:  # x·scale rounded to x's dtype: the product of two such values is exact in float32, one rounding
            x = (x.to(tl.float32) * scale).to(x_ptr.dtype.element_ty)
        x = scaled(x.to(tl.float32), xs_ptr, ws_ptr, src, cols, m, DEQ)  # DEQ: x is an Int32Product's
        if HAS_RES:
            x = x + _load_hinted(r_ptr + src * H + cols, m, HINT, True)
        w = tl.load(w_ptr + cols, mask=m, other=0.0)  # before the reduction: see below
        _store_residual(s_ptr + row * H + cols, x, m, HINT)
        inv = 1.0 / tl.sqrt(tl.sum(x * x, 0) / H + eps)
        w = w.to(tl.float32)
        if OFFSET:
            w = w + 1.0
        if INT8:  # y_ptr is the int8 output: the next GEMM's input quantized per row here, not in a launch of its own
            store_quantized(y_ptr + row * H, qs_ptr + row, m_ptr, cols, m, x * inv * w, SMOOTH=SMOOTH)
        else:
            tl.store(y_ptr + row * H + cols, (x * inv * w).to(y_ptr.dtype.element_ty), mask=m)


def norm_warps(h: int, rows: int = 0, pair: bool = False) -> int:
    """Warps per row of the norm kernel: on an H100 (bench/RESULTS.md, "norm kernel: … per warps setting") 16 warps
    were the fastest at hidden 2560 and 4096 (3-7 % over 4); Triton's default 4 below 1024. `pair`: Gemma3's norm
    pair, whose loads before the first reduction take more registers, over more than 256 rows: 8 warps (Gemma3-4B's
    norms at batch 4, 440 rows, 0.362-0.373 → 0.345 ms a forward; at batch 1, 126 rows, 0.177-0.179 → 0.188, so
    16 stay there) (H100, bench/RESULTS.md)."""
    return 4 if h <= 1024 else 8 if h <= 2048 or (pair and rows > 256) else 16


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
                out_dtype: torch.dtype | None = None, offset: bool = False, rows: torch.Tensor | None = None,
                impl: str = "auto", scale: float | None = None, int8=None):
    """(RMSNorm(x + residual) · weight, x + residual): the residual stream (`residual`, and the sum returned)
    in float32; the normed output in `out_dtype` (default x's: what the next GEMM reads). `offset`: Gemma3's
    RMSNorm, × (1 + weight). `rows` [R] (int64): only these rows, gathered by the kernel itself (the last layer
    keeps only the rows the tail reads: no gather launches before it; the first gathers the embedding table's).
    `scale` (a value of x's dtype): x × scale first, rounded to x's dtype (Gemma3's scaled embedding). `int8`: the
    normed output quantized per row for a W8A8 GEMM ((int8, scales) in its place; int8_kernels.normed_output). impl: auto, or torch /
    triton (tests). x may be an Int32Product: its scales applied as it is loaded."""
    if impl == "torch" or (impl == "auto" and not use_triton(product_args(x)[0])):
        return add_rmsnorm_torch(x, residual, weight, eps, out_dtype, offset, rows, scale, int8)
    x, xs, ws, deq = product_args(x)
    n, h = (x.shape[0] if rows is None else rows.shape[0]), x.shape[1]
    s = torch.empty(n, h, dtype=torch.float32, device=x.device)
    q, qs, sm = int8_outputs(int8, s, n, h)
    y = q if int8 is not None else torch.empty(n, h, dtype=out_dtype or x.dtype, device=x.device)
    _add_rmsnorm_kernel[(n,)](x, residual if residual is not None else s, weight, y, s, rows if rows is not None else s,
                              qs, sm, xs, ws, h, eps, 1.0 if scale is None else scale, HAS_RES=residual is not None,
                              OFFSET=offset, GATHER=rows is not None, SCALE=scale is not None,
                              BLOCK=triton.next_power_of_2(h), HINT=residual_hints(x, n), num_warps=norm_warps(h),
                              INT8=int8 is not None, SMOOTH=int8 is not None and int8 is not True, DEQ=deq)
    return ((y, qs) if int8 is not None else y), s


# ---- Gemma3's post-norm + residual add + the next pre-norm -------------------------------------------------
def post_add_rmsnorm_torch(x, residual, w_post, eps_post, weight, eps, out_dtype, offset: bool = False, rows=None,
                           int8=None):
    """(RMSNorm(residual + RMSNorm_post(x)) in out_dtype, residual + RMSNorm_post(x) in float32): the two norms
    add_rmsnorm_torch runs one after the other, the post-norm's output kept in float32; `rows` as there."""
    if isinstance(x, Int32Product):
        x = x.dense()
    if rows is not None:
        x, residual = x[rows], residual[rows]
    d, _ = add_rmsnorm_torch(x, None, w_post, eps_post, torch.float32, offset)
    return add_rmsnorm_torch(d, residual, weight, eps, out_dtype, offset, int8=int8)


if triton is not None:
    @triton.jit
    def _post_add_rmsnorm_kernel(x_ptr, r_ptr, wp_ptr, w_ptr, y_ptr, s_ptr, rows_ptr, qs_ptr, m_ptr, xs_ptr, ws_ptr, H,
                                 eps_post, eps, OFFSET: tl.constexpr, GATHER: tl.constexpr, BLOCK: tl.constexpr,
                                 HINT: tl.constexpr, INT8: tl.constexpr, SMOOTH: tl.constexpr, DEQ: tl.constexpr):
        """_add_rmsnorm_kernel's two launches in one: d = RMSNorm_post(x) in float32, s = r + d, y = RMSNorm(s).
        The same operations as the two launches (the compiler may fuse d's last product with the add: one float32
        rounding fewer), without d written and read back (unfused, Gemma3 ran 137 norm launches a forward,
        0.35 ms at 126 tokens on an H100)."""
        row = tl.program_id(0)
        src = tl.load(rows_ptr + row) if GATHER else row  # as in _add_rmsnorm_kernel
        cols = tl.arange(0, BLOCK)
        m = cols < H
        # every load before the first reduction: its barriers keep later loads from being issued early, and
        # each load waited on after one is another memory round trip in the launch's chain
        x = _load_hinted(x_ptr + src * H + cols, m, HINT, False).to(tl.float32)  # HINT: residual_hints
        x = scaled(x, xs_ptr, ws_ptr, src, cols, m, DEQ)
        r = _load_hinted(r_ptr + src * H + cols, m, HINT, True)
        wp = tl.load(wp_ptr + cols, mask=m, other=0.0)
        w = tl.load(w_ptr + cols, mask=m, other=0.0)
        inv = 1.0 / tl.sqrt(tl.sum(x * x, 0) / H + eps_post)
        wp = wp.to(tl.float32)
        if OFFSET:
            wp = wp + 1.0
        s = x * inv * wp + r
        _store_residual(s_ptr + row * H + cols, s, m, HINT)
        inv2 = 1.0 / tl.sqrt(tl.sum(s * s, 0) / H + eps)
        w = w.to(tl.float32)
        if OFFSET:
            w = w + 1.0
        if INT8:  # as in _add_rmsnorm_kernel
            store_quantized(y_ptr + row * H, qs_ptr + row, m_ptr, cols, m, s * inv2 * w, SMOOTH=SMOOTH)
        else:
            tl.store(y_ptr + row * H + cols, (s * inv2 * w).to(y_ptr.dtype.element_ty), mask=m)


def post_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, w_post: torch.Tensor, eps_post: float,
                     weight: torch.Tensor, eps: float, out_dtype: torch.dtype, offset: bool = False,
                     impl: str = "auto", rows: torch.Tensor | None = None, int8=None):
    """Gemma3's norm after attention or the MLP, its output added to the float32 residual, and the next norm:
    (RMSNorm(s) · weight in out_dtype, s = residual + RMSNorm_post(x) · w_post in float32). One launch on CUDA
    (engine.fuse_post_norms); `rows`, `int8` and x as add_rmsnorm's; impl: auto, or torch / triton (tests)."""
    if impl == "torch" or (impl == "auto" and not use_triton(product_args(x)[0])):
        return post_add_rmsnorm_torch(x, residual, w_post, eps_post, weight, eps, out_dtype, offset, rows, int8)
    x, xs, ws, deq = product_args(x)
    n, h = (x.shape[0] if rows is None else rows.shape[0]), x.shape[1]
    s = torch.empty(n, h, dtype=torch.float32, device=x.device)
    q, qs, sm = int8_outputs(int8, s, n, h)
    y = q if int8 is not None else torch.empty(n, h, dtype=out_dtype, device=x.device)
    _post_add_rmsnorm_kernel[(n,)](x, residual, w_post, weight, y, s, rows if rows is not None else s, qs, sm, xs, ws,
                                   h, eps_post, eps, OFFSET=offset, GATHER=rows is not None,
                                   BLOCK=triton.next_power_of_2(h), HINT=residual_hints(x, n),
                                   num_warps=norm_warps(h, n, pair=True), INT8=int8 is not None,
                                   SMOOTH=int8 is not None and int8 is not True, DEQ=deq)
    return ((y, qs) if int8 is not None else y), s


# ---- the tokens' rows of the RoPE tables ---------------------------------------------------------------
if triton is not None:
    @triton.jit
    def _gather_rows_kernel(t_ptr, idx_ptr, out_ptr, P, N, D: tl.constexpr, K: tl.constexpr, BLOCK: tl.constexpr):
        t = tl.program_id(0)
        p = tl.load(idx_ptr + t)
        cols = tl.arange(0, BLOCK)
        m = cols < D
        for k in tl.static_range(K):
            tl.store(out_ptr + (k * N + t) * D + cols, tl.load(t_ptr + (k * P + p) * D + cols, mask=m), mask=m)


def gather_rows(tables: torch.Tensor, idx: torch.Tensor, impl: str = "auto") -> torch.Tensor:
    """[K, N, D] = tables [K, P, D] at rows idx [N] (int64), each [N, D] slice contiguous: the K cos/sin tables of a
    forward's RoPE kinds at its tokens' positions in one launch on CUDA (one per kind: Gemma3-4B gathered its two kinds'
    cos and sin in four launches). impl: auto, or torch / triton (tests)."""
    if impl == "torch" or (impl == "auto" and not use_triton(tables)):
        return tables[:, idx]
    k, p, d = tables.shape
    n = idx.shape[0]
    out = torch.empty(k, n, d, dtype=tables.dtype, device=tables.device)
    _gather_rows_kernel[(n,)](tables, idx, out, p, n, D=d, K=k, BLOCK=triton.next_power_of_2(d), num_warps=2)
    return out
