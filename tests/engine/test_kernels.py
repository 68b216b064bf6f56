"""The fused kernels: torch versions equal transformers' modules (CPU); Triton versions equal the torch
versions (GPU); the attention layout runs on the memory-efficient SDPA kernel (GPU)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from qcls.engine import kernels as K


def test_torch_rmsnorm_matches_transformers():
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm
    norm = Qwen3RMSNorm(64, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_(1, 0.1)
    x, r = torch.randn(5, 64), torch.randn(5, 64)
    y, s = K.add_rmsnorm(x, r, norm.weight, 1e-6)
    assert torch.allclose(s, x + r) and torch.allclose(y, norm(x + r), atol=1e-6)


def test_torch_rope_matches_transformers():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    q, k = torch.randn(1, 3, 7, 16), torch.randn(1, 2, 7, 16)
    ang = torch.randn(7, 8)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    q2, k2 = apply_rotary_pos_emb(q, k, cos[None], sin[None])
    out = torch.empty(7, 3, 16)
    K.rope_into(q[0].transpose(0, 1), cos, sin, None, 0.0, out)
    assert torch.allclose(out, q2[0].transpose(0, 1), atol=1e-6)


gpu = pytest.mark.gpu


def _cuda():
    if not torch.cuda.is_available() or K.triton is None:
        pytest.skip("needs a CUDA GPU with Triton")


@gpu
@pytest.mark.parametrize("h", [64, 2560, 4096])
def test_triton_add_rmsnorm(h):
    _cuda()
    x, r = torch.randn(37, h, device="cuda", dtype=torch.float16), torch.randn(37, h, device="cuda", dtype=torch.float16)
    w = torch.randn(h, device="cuda", dtype=torch.float16)
    for res in (None, r):
        y, s = K.add_rmsnorm(x, res, w, 1e-6)
        y0, s0 = K.add_rmsnorm_torch(x, res, w, 1e-6)
        assert torch.equal(s, s0) and (y.float() - y0.float()).abs().max() < 2e-2


@gpu
@pytest.mark.parametrize("norm", [False, True])
def test_triton_rope_into_strided_buffer(norm):
    _cuda()
    n, heads, d, slots = 29, 8, 128, 64
    qkv = torch.randn(n, 3 * heads * d, device="cuda", dtype=torch.float16)
    x = qkv[:, heads * d:2 * heads * d].view(n, heads, d)  # a strided view, as split from the fused GEMM
    ang = torch.randn(n, d // 2, device="cuda")
    cos, sin = torch.cat([ang, ang], -1).cos().half(), torch.cat([ang, ang], -1).sin().half()
    w = torch.randn(d, device="cuda", dtype=torch.float16) if norm else None
    buf = torch.zeros(heads, slots, d, device="cuda", dtype=torch.float16)
    K.rope_into(x, cos, sin, w, 1e-6, buf[:, 10:10 + n].transpose(0, 1))
    want = K.rope_torch(x, cos, sin, w, 1e-6)
    assert (buf[:, 10:10 + n].transpose(0, 1).float() - want.float()).abs().max() < 2e-2
    assert buf[:, :10].abs().sum() == 0 and buf[:, 10 + n:].abs().sum() == 0


@gpu
def test_triton_silu_mul():
    _cuda()
    gu = torch.randn(19, 2 * 9728, device="cuda", dtype=torch.float16)
    want = F.silu(gu[:, :9728]) * gu[:, 9728:]
    assert (K.silu_mul(gu).float() - want.float()).abs().max() < 2e-2


@gpu
def test_engine_attention_layout_runs_on_mem_efficient_kernel():
    """Queries [groups, kv_heads, N, d] (a permuted view), K/V expanded over groups with stride 0, an
    additive mask broadcast over batch and heads: accepted by the memory-efficient kernel alone."""
    _cuda()
    n, nkv, g, d, keys = 190, 8, 4, 128, 576
    q = torch.randn(n, nkv * g, d, device="cuda", dtype=torch.float16)
    kb = torch.randn(nkv, keys, d, device="cuda", dtype=torch.float16)
    mask = torch.zeros(n, keys, device="cuda", dtype=torch.float16)
    mask[:, 300:] = float("-inf")
    qq = q.view(n, nkv, g, d).permute(2, 1, 0, 3)
    kk = kb[None].expand(g, nkv, keys, d)
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        o = F.scaled_dot_product_attention(qq, kk, kk, attn_mask=mask[None, None])
    with sdpa_kernel([SDPBackend.MATH]):
        ref = F.scaled_dot_product_attention(qq.float(), kk.float(), kk.float(), attn_mask=mask[None, None].float())
    assert (o.float() - ref).abs().max() < 2e-2
