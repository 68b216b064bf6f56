"""The W8A8 linear: exact integer arithmetic against a plain int64 reference, the per-row quantization, joining."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from qcls.engine import int8_kernels as k8
from qcls.engine.int8_linear import Int8Linear, QuantizedRows, int_mm, quantize_weight


def test_int_mm_is_exact_integer_arithmetic():
    g = torch.Generator().manual_seed(0)
    for m in (1, 7, 17, 40):
        q = torch.randint(-127, 128, (m, 96), generator=g, dtype=torch.int8)
        w = torch.randint(-127, 128, (40, 96), generator=g, dtype=torch.int8)
        assert torch.equal(int_mm(q, w), (q.long() @ w.long().t()).int())


def test_quantize_rows_matches_its_definition():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 64, generator=g) * torch.linspace(0.1, 20, 64)
    smooth = torch.rand(64, generator=g) + 0.5
    q, s = k8.quantize_rows(x, smooth)
    t = x * smooth
    assert torch.allclose(s, t.abs().amax(1) / 127)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127  # the largest value of each row maps to ±127
    assert (q.float() * s[:, None] - t).abs().max() <= (s / 2).max() * (1 + 1e-6)  # within half a step
    zero, zs = k8.quantize_rows(torch.zeros(2, 64), None)  # an all-zero row stays zero, with a finite scale
    assert not zero.any() and torch.isfinite(zs).all()


def test_int8_linear_equals_the_integer_reference():
    g = torch.Generator().manual_seed(2)
    lin = nn.Linear(64, 48, bias=True)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(48, 64, generator=g))
        lin.bias.copy_(torch.randn(48, generator=g))
    smooth = torch.rand(64, generator=g) + 0.5
    mod = Int8Linear.from_linear(lin, smooth, torch.float32)
    x = torch.randn(3, 9, 64, generator=g)
    y = mod(x)
    assert y.shape == (3, 9, 48)
    qx, sx = k8.quantize_rows_torch(x.reshape(-1, 64), smooth)
    qw, sw = quantize_weight(lin.weight, smooth)
    ref = (qx.long() @ qw.long().t()).double() * sx.double()[:, None] * sw.double()[None, :] + lin.bias.double()
    assert torch.allclose(y.reshape(-1, 48).double(), ref, rtol=1e-5, atol=1e-5)
    # and W8A8 stays close to the floating-point product it replaces
    assert (y - lin(x)).norm() / lin(x).norm() < 0.02
    # an input quantized by its producer gives the same result
    assert torch.allclose(mod(QuantizedRows(qx, sx)), y.reshape(-1, 48))


def test_join_shares_the_tensors_and_equals_the_parts():
    g = torch.Generator().manual_seed(3)
    smooth = torch.rand(32, generator=g) + 0.5
    parts = []
    for n in (16, 8, 8):
        lin = nn.Linear(32, n, bias=False)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(n, 32, generator=g))
        parts.append(Int8Linear.from_linear(lin, smooth, torch.float32))
    from qcls.engine.decoder import _fuse_linears
    joined = _fuse_linears(parts)
    x = torch.randn(5, 32, generator=g)
    assert torch.allclose(joined(x), torch.cat([p(x) for p in parts], -1))
    assert parts[1].qweight.data_ptr() == joined.qweight.data_ptr() + 16 * 32  # views: no second copy
    assert _fuse_linears(parts).qweight.data_ptr() == joined.qweight.data_ptr()  # a second engine shares it
    other = Int8Linear.from_linear(nn.Linear(32, 8, bias=False), None, torch.float32)
    assert _fuse_linears([parts[0], other]) is None  # two smoothings: no one input quantization


def test_shapes_the_int8_gemm_cannot_take_are_refused():
    with pytest.raises(ValueError, match="multiples of 8"):
        Int8Linear(torch.zeros(12, 30, dtype=torch.int8), torch.ones(12), None, None, torch.float32)


def test_the_norm_and_activation_emit_what_quantize_rows_gives():
    from qcls.engine.act_kernels import silu_mul
    from qcls.engine.kernels import add_rmsnorm
    g = torch.Generator().manual_seed(4)
    x, w, smooth = torch.randn(6, 64, generator=g), torch.rand(64, generator=g), torch.rand(64, generator=g) + 0.5
    y, _ = add_rmsnorm(x, None, w, 1e-6, torch.float32)
    (q, s), _ = add_rmsnorm(x, None, w, 1e-6, torch.float32, int8=smooth)
    assert torch.equal(q, k8.quantize_rows(y, smooth)[0]) and torch.allclose(s, k8.quantize_rows(y, smooth)[1])
    gu = torch.randn(6, 128, generator=g)
    q2, s2 = silu_mul(gu, int8=True)
    q3, s3 = k8.quantize_rows(silu_mul(gu), None)
    assert torch.equal(q2, q3) and torch.allclose(s2, s3)


@pytest.mark.parametrize("kernel", ["onednn", "int_mm"])
@pytest.mark.parametrize("n_out,n_in", [(48, 64), (64, 48)])
def test_the_cpu_kernels_give_the_integer_products(monkeypatch, kernel, n_out, n_in):
    """On the CPU the GEMM runs as oneDNN's packed kernel where its start-up check finds it exact, else as
    torch._int_mm: either gives q @ w^T exactly, and the linear's output is those integers scaled."""
    from qcls.engine import int8_linear
    if kernel == "onednn" and int8_linear.cpu_gemm()[0] != "onednn":
        pytest.skip(f"oneDNN's kernel is not used on this machine: {int8_linear.cpu_gemm()[1]}")
    monkeypatch.setattr(int8_linear, "cpu_gemm", lambda: (kernel, "test"))
    g = torch.Generator().manual_seed(5)
    lin = nn.Linear(n_in, n_out, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n_out, n_in, generator=g))
    mod = Int8Linear.from_linear(lin, None, torch.float32)
    x = torch.randn(7, n_in, generator=g)
    q, sx = k8.quantize_rows_torch(x, None)
    exact = q.long() @ mod.qweight.long().t()
    assert torch.equal(mod._gemm(q).double(), exact.double())
    assert torch.equal(mod(x), exact.float() * sx[:, None] * mod.wscale[None, :])
