"""The fused kernels: torch versions equal transformers' modules (CPU); Triton versions equal the torch
versions (GPU); the attention layout runs on the memory-efficient SDPA kernel (GPU)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from qcls.engine import act_kernels as A
from qcls.engine import kernels as K
from qcls.engine import qkv_kernels as Q


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
    q, k, v = torch.randn(1, 4, 7, 16), torch.randn(1, 2, 7, 16), torch.randn(1, 2, 7, 16)
    ang = torch.randn(7, 8)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    q2, k2 = apply_rotary_pos_emb(q, k, cos[None], sin[None])
    out, kb, vb = torch.empty(7, 4, 16), torch.zeros(2, 20, 16), torch.zeros(2, 20, 16)
    slots = torch.arange(5, 12)
    Q.qkv_into(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cos, sin, None, None, 0.0,
               out, kb, vb, slots)
    assert torch.allclose(out, q2[0].transpose(0, 1), atol=1e-6)
    assert torch.allclose(kb[:, 5:12], k2[0], atol=1e-6) and torch.equal(vb[:, 5:12], v[0])
    assert kb[:, :5].abs().sum() == 0 and vb[:, 12:].abs().sum() == 0


def _qkv_case(device, dtype, norm, n=29, heads=8, kv=2, d=64, slots=64, hb=1, offset=False):
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(n, (heads + 2 * kv) * d, generator=g).to(device, dtype)
    qp, kp, vp = (t.view(n, -1, d) for t in qkv.split([heads * d, kv * d, kv * d], -1))  # strided, as in the engine
    ang = torch.randn(n, d // 2, generator=g)
    cos, sin = (torch.cat([ang, ang], -1).cos().to(device, dtype), torch.cat([ang, ang], -1).sin().to(device, dtype))
    qw, kw = ((torch.randn(d, generator=g).to(device, dtype), torch.randn(d, generator=g).to(device, dtype))
              if norm else (None, None))
    where = torch.randperm(slots, generator=g)[:n].to(device)  # scattered slots (the prefix fill) …
    outs = []
    for impl in ("triton", "torch"):
        q, kb, vb = torch.empty(n, heads, d, device=device, dtype=dtype), *(torch.zeros(kv, slots, d, device=device,
                                                                                         dtype=dtype) for _ in "kv")
        Q.qkv_into(qp, kp, vp, cos, sin, qw, kw, 1e-6, q, kb, vb, where, impl=impl, offset=offset,
                   heads_per_program=hb)
        outs.append((q, kb, vb))
    (q1, k1, v1), (q0, k0, v0) = outs  # Triton, torch
    tol = 2e-2 if dtype == torch.float16 else 1e-5
    assert (q1.float() - q0.float()).abs().max() < tol and (k1.float() - k0.float()).abs().max() < tol
    assert torch.equal(v1, v0)
    untouched = torch.ones(slots, dtype=torch.bool)
    untouched[where.cpu()] = False
    assert k1[:, untouched.to(device)].abs().sum() == 0


@pytest.mark.skipif(K.triton is None or torch.cuda.is_available(), reason="interpreter run: needs Triton, no GPU")
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("hb", [1, 2])  # one head per program, and the blocked kernel
def test_qkv_kernel_interpreted(norm, hb):
    _qkv_case("cpu", torch.float32, norm, hb=hb, offset=norm and hb == 2)


def _post_norm_case(device, dtype, h=96, n=7):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(n, h, generator=g) * 3).to(device, dtype)
    r = torch.randn(n, h, generator=g).to(device)  # the float32 residual stream
    wp, w = (torch.randn(h, generator=g) * 0.1).to(device, dtype), (torch.randn(h, generator=g) * 0.1).to(device, dtype)
    rows = torch.tensor([n - 1, 0, 2, 2], device=device)  # the last layer's read rows: any order, repeats
    for sel in (None, rows):
        out = {impl: K.post_add_rmsnorm(x, r, wp, 1e-6, w, 1e-5, dtype, offset=True, impl=impl, rows=sel)
               for impl in ("triton", "torch")}
        (y1, s1), (y0, s0) = out["triton"], out["torch"]
        # the torch version is the two separate norms; the kernel the same math in one pass
        xs, rs = (x, r) if sel is None else (x[sel], r[sel])
        d, _ = K.add_rmsnorm_torch(xs, None, wp, 1e-6, torch.float32, True)
        assert torch.equal(s0, d + rs)
        assert (s1 - s0).abs().max() <= 1e-5 * s0.abs().max()
        tol = 2e-2 if dtype == torch.float16 else 1e-5
        assert (y1.float() - y0.float()).abs().max() < tol


def _norm_case(device, dtype, h=96, n=7):
    """add_rmsnorm's kernel against its torch version, with and without a residual and a row selection."""
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(n, h, generator=g) * 3).to(device, dtype)
    r = torch.randn(n, h, generator=g).to(device)
    w = (torch.randn(h, generator=g) * 0.1).to(device, dtype)
    rows = torch.tensor([3, 3, 0, n - 1], device=device)
    for res in (None, r):
        for sel in (None, rows):
            y1, s1 = K.add_rmsnorm(x, res, w, 1e-6, offset=True, rows=sel, impl="triton")
            y0, s0 = K.add_rmsnorm(x, res, w, 1e-6, offset=True, rows=sel, impl="torch")
            want = (x.float() if res is None else x.float() + res)[slice(None) if sel is None else sel]
            assert torch.equal(s0, want) and torch.equal(s1, want)
            assert (y1.float() - y0.float()).abs().max() < (2e-2 if dtype == torch.float16 else 1e-5)
    # the first layer's norm on Gemma3's embedding table: the gathered rows × √hidden rounded as its module rounds
    # (rows × embed_scale.to(dtype), a product in the table's dtype), then summed into the float32 stream as they are
    scale = float(torch.tensor(h ** 0.5).to(dtype))
    want = (x[rows] * torch.tensor(h ** 0.5).to(dtype)).float()
    for impl in ("triton", "torch"):
        y, s = K.add_rmsnorm(x, None, w, 1e-6, offset=True, rows=rows, impl=impl, scale=scale)
        assert torch.equal(s, want), impl
        y0, _ = K.add_rmsnorm_torch(want, None, w, 1e-6, dtype, True)
        assert (y.float() - y0.float()).abs().max() < (2e-2 if dtype == torch.float16 else 1e-5)


def _gather_case(device):
    """gather_rows' kernel against indexing: every table's rows at the indices, repeats included, each [N, D] slice
    contiguous (what the fused q/k/v kernels read as cos/sin)."""
    g = torch.Generator().manual_seed(3)
    tables = torch.randn(4, 11, 16, generator=g).to(device, torch.float16)
    idx = torch.tensor([0, 10, 3, 3, 7], device=device)
    got = K.gather_rows(tables, idx, impl="triton")
    assert torch.equal(got, tables[:, idx]) and torch.equal(K.gather_rows(tables, idx, impl="torch"), tables[:, idx])
    assert all(got[k].is_contiguous() for k in range(4))


@pytest.mark.skipif(K.triton is None or torch.cuda.is_available(), reason="interpreter run: needs Triton, no GPU")
def test_gather_rows_interpreted():
    _gather_case("cpu")


@pytest.mark.skipif(K.triton is None or torch.cuda.is_available(), reason="interpreter run: needs Triton, no GPU")
@pytest.mark.parametrize("hints", [False, True])  # the L2 eviction hints (kernels.residual_hints) change no value
def test_post_norm_kernel_interpreted(hints, monkeypatch):
    monkeypatch.setattr(K, "RESIDUAL_HINTS", hints)
    _post_norm_case("cpu", torch.float32)


@pytest.mark.skipif(K.triton is None or torch.cuda.is_available(), reason="interpreter run: needs Triton, no GPU")
@pytest.mark.parametrize("hints", [False, True])
def test_norm_kernel_with_rows_interpreted(hints, monkeypatch):
    monkeypatch.setattr(K, "RESIDUAL_HINTS", hints)
    _norm_case("cpu", torch.float32)


def test_residual_hints_off_the_gpu(monkeypatch):
    """No hints for tensors off the GPU; a forced setting wins (tests)."""
    x = torch.zeros(4, 8)
    assert not K.residual_hints(x, 4)
    monkeypatch.setattr(K, "RESIDUAL_HINTS", True)
    assert K.residual_hints(x, 4)


def test_qkv_heads_per_program():
    assert Q.qkv_heads_per_program(32, 8) == 8 and Q.qkv_heads_per_program(8, 4) == 4
    assert Q.qkv_heads_per_program(4, 1) == 1 and Q.qkv_heads_per_program(32, 8, 1) == 1
    with pytest.raises(ValueError, match="qkv_heads_per_program=3"):
        Q.qkv_heads_per_program(32, 8, 3)


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
@pytest.mark.parametrize("hb", [1, 8])
def test_triton_qkv_into(norm, hb):
    _cuda()
    _qkv_case("cuda", torch.float16, norm, heads=32, kv=8, d=128, hb=hb)


@gpu
@pytest.mark.parametrize("hints", [False, True])
def test_triton_post_add_rmsnorm(hints, monkeypatch):
    _cuda()
    monkeypatch.setattr(K, "RESIDUAL_HINTS", hints)
    _post_norm_case("cuda", torch.float16, h=2560, n=37)


@gpu
def test_residual_hints_within_a_quarter_of_the_l2():
    """On sm_80+ the hints hold while rows × hidden float32 is at most a quarter of the L2; sm_75 never."""
    _cuda()
    x = torch.zeros(1, 2560, device="cuda", dtype=torch.float16)
    props = torch.cuda.get_device_properties(0)
    fit = props.L2_cache_size // 4 // (2560 * 4)
    if torch.cuda.get_device_capability(0) < (8, 0):
        assert not K.residual_hints(x, 1)
    else:
        assert K.residual_hints(x, fit) and not K.residual_hints(x, fit + 1)


@gpu
def test_triton_gather_rows():
    _cuda()
    _gather_case("cuda")


@gpu
@pytest.mark.parametrize("hints", [False, True])
def test_triton_add_rmsnorm_rows(hints, monkeypatch):
    _cuda()
    monkeypatch.setattr(K, "RESIDUAL_HINTS", hints)
    _norm_case("cuda", torch.float16, h=2560, n=37)


@gpu
def test_triton_silu_mul():
    _cuda()
    gu = torch.randn(19, 2 * 9728, device="cuda", dtype=torch.float16)
    want = F.silu(gu[:, :9728]) * gu[:, 9728:]
    assert (A.silu_mul(gu).float() - want.float()).abs().max() < 2e-2


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
