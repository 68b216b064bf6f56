"""The gated activation of the decoder's MLP: SiLU·mul (Llama/Qwen), GELU-tanh·mul (Gemma3), float32 inside and
rounded once where the down projection reads it (or quantized per row for a W8A8 one). Triton on CUDA, plain torch
elsewhere (the torch version defines the math), as the other kernels of qcls/engine/kernels.py.
"""
from __future__ import annotations

import torch

from qcls.engine.int8_kernels import Int32Product, int8_outputs, normed_output
from qcls.engine.kernels import triton, use_triton

if triton is not None:
    import triton.language as tl
    from qcls.engine.int8_kernels import scaled, store_quantized

    @triton.jit
    def _act_mul_kernel(g_ptr, u_ptr, out_ptr, qs_ptr, m_ptr, xs_ptr, wg_ptr, wu_ptr, I, g_s0, u_s0, GELU: tl.constexpr,
                        BLOCK: tl.constexpr, INT8: tl.constexpr, SMOOTH: tl.constexpr, DEQ: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = cols < I
        g = tl.load(g_ptr + row * g_s0 + cols, mask=m, other=0.0).to(tl.float32)
        u = tl.load(u_ptr + row * u_s0 + cols, mask=m, other=0.0).to(tl.float32)
        g = scaled(g, xs_ptr, wg_ptr, row, cols, m, DEQ)  # DEQ: gate and up are an Int32Product's halves
        u = scaled(u, xs_ptr, wu_ptr, row, cols, m, DEQ)
        if GELU:  # 0.5·g·(1 + tanh(z)) = g·sigmoid(2z), z = √(2/π)·(g + 0.044715·g³)
            z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
            a = g / (1.0 + tl.exp(-2.0 * z))
        else:
            a = g / (1.0 + tl.exp(-g))
        if INT8:  # one program holds the whole row (BLOCK ≥ I): its scale needs every column
            store_quantized(out_ptr + row * I, qs_ptr + row, m_ptr, cols, m, a * u, SMOOTH=SMOOTH)
        else:
            tl.store(out_ptr + row * I + cols, (a * u).to(out_ptr.dtype.element_ty), mask=m)


def act_mul(g: torch.Tensor, u: torch.Tensor, gelu: bool, int8=None, scales=None):
    """act(g) * u for [N, I] gate and up (rows may be strided, e.g. the halves of one fused GEMM's output),
    float32 inside, rounded once. Modules that run gate and up as two GEMMs (quantized or streamed linears)
    come here too, so their activation rounds as the fused path's does (transformers' MLP rounds act(g)
    and the product separately). `int8`: quantized per row for a W8A8 down projection (add_rmsnorm's).
    `scales` (CUDA, with int8): (row scales, gate's column scales, up's): g and u are an int32 product's halves."""
    if not use_triton(g):
        f = g.float()
        a = torch.nn.functional.gelu(f, approximate="tanh") if gelu else torch.nn.functional.silu(f)
        return normed_output(a * u.float(), g.dtype, int8)
    if g.stride(-1) != 1 or u.stride(-1) != 1:
        raise ValueError("act_mul needs unit stride along the intermediate dim")
    if scales is not None and int8 is None:
        raise ValueError("act_mul reads an int32 product only for a W8A8 down projection (int8=)")
    n, i = g.shape
    q, qs, sm = int8_outputs(int8, g, n, i)
    out = q if int8 is not None else torch.empty(n, i, dtype=g.dtype, device=g.device)
    block = 1024 if int8 is None else triton.next_power_of_2(i)
    xs, wg, wu = scales if scales is not None else (qs, qs, qs)
    _act_mul_kernel[(n, triton.cdiv(i, block))](g, u, out, qs, sm, xs, wg, wu, i, g.stride(0), u.stride(0), GELU=gelu,
                                                BLOCK=block, INT8=int8 is not None,
                                                SMOOTH=int8 is not None and int8 is not True, DEQ=scales is not None,
                                                num_warps=4 if int8 is None else 16)
    return (out, qs) if int8 is not None else out


def _act_mul(gu, gelu: bool, int8=None):
    """act_mul of gu's halves; gu may be an Int32Product (gate/up's W8A8 output before its scales)."""
    scales = None
    if isinstance(gu, Int32Product):
        if not use_triton(gu.acc):
            gu = gu.dense()
        else:
            i = gu.acc.shape[-1] // 2
            scales, gu = (gu.xscale, gu.wscale[:i], gu.wscale[i:]), gu.acc
    i = gu.shape[-1] // 2
    return act_mul(gu[..., :i], gu[..., i:], gelu, int8, scales)


def silu_mul(gu: torch.Tensor, int8=None):
    """silu(gate) * up for gu = [gate | up] along the last dim (float32 inside, one rounding)."""
    return _act_mul(gu, gelu=False, int8=int8)


def gelu_tanh_mul(gu: torch.Tensor, int8=None):
    """gelu_tanh(gate) * up for gu = [gate | up] (transformers' gelu_pytorch_tanh), float32 inside."""
    return _act_mul(gu, gelu=True, int8=int8)
