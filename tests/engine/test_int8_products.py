"""A W8A8 linear's int32 product handed to the kernel that reads it (the next norm, the gated activation), which
applies the scales as it loads: the Triton kernels (interpreted on the CPU, compiled on a GPU) give what the torch
definitions give on the product's float32 values."""
from __future__ import annotations

import pytest
import torch

from qcls.engine import act_kernels as A
from qcls.engine import kernels as K
from qcls.engine.int8_kernels import Int32Product
from qcls.engine.int8_linear import Int8Linear

pytestmark = pytest.mark.skipif(K.triton is None, reason="needs Triton (interpreted without a GPU)")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _product(m: int, n: int, g: torch.Generator) -> Int32Product:
    acc = torch.randint(-40000, 40000, (m, n), generator=g, dtype=torch.int32)
    xs, ws = torch.rand(m, generator=g) * 1e-3, torch.rand(n, generator=g) * 1e-2
    return Int32Product(acc.to(DEVICE), xs.to(DEVICE), ws.to(DEVICE))


def _close_rows(a: tuple, b: tuple) -> None:
    """int8 rows equal up to one rounding step where float32 sums differ in order; scales to float32 precision."""
    assert (a[0].int() - b[0].int()).abs().max() <= 1 and (a[0] != b[0]).float().mean() < 1e-2
    assert torch.allclose(a[1], b[1], rtol=1e-5)


@pytest.mark.parametrize("gather", [False, True])
def test_the_norms_read_a_product_as_its_float_values(gather):
    g = torch.Generator().manual_seed(0)
    h = 64
    p = _product(9, h, g)
    r = torch.randn(9, h, generator=g).to(DEVICE)
    w, smooth = torch.rand(h, generator=g).to(DEVICE), (torch.rand(h, generator=g) + 0.5).to(DEVICE)
    rows = torch.tensor([8, 2, 5], device=DEVICE) if gather else None
    for int8 in (None, smooth):
        got, s = K.add_rmsnorm(p, r, w, 1e-6, torch.float32, rows=rows, impl="triton", int8=int8)
        want, s2 = K.add_rmsnorm(p.dense(), r, w, 1e-6, torch.float32, rows=rows, impl="torch", int8=int8)
        assert torch.allclose(s, s2, rtol=1e-5, atol=1e-5)
        _close_rows(got, want) if int8 is not None else torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        got, s = K.post_add_rmsnorm(p, r, w, 1e-6, w, 1e-6, torch.float32, True, impl="triton", rows=rows, int8=int8)
        want, s2 = K.post_add_rmsnorm(p.dense(), r, w, 1e-6, w, 1e-6, torch.float32, True, impl="torch", rows=rows,
                                      int8=int8)
        assert torch.allclose(s, s2, rtol=1e-5, atol=1e-5)
        _close_rows(got, want) if int8 is not None else torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act", [A.silu_mul, A.gelu_tanh_mul])
@pytest.mark.parametrize("inter", [96, 2100])  # a row within one block of columns; one that does not fill its block
def test_the_activation_reads_gate_and_up_as_a_product(act, inter, monkeypatch):
    g = torch.Generator().manual_seed(1)
    p = _product(7, 2 * inter, g)
    p.acc[3, inter - 1] = 60000  # the row's largest value in its last column: the scale sees every column
    smooth = (torch.rand(inter, generator=g) + 0.5).to(DEVICE)
    dense = p.dense()
    monkeypatch.setattr(A, "use_triton", lambda x: False)
    want = {int8 is True: act(dense, int8=int8) for int8 in (True, smooth)}  # the torch definition
    monkeypatch.setattr(A, "use_triton", lambda x: True)  # the Triton kernel, interpreted where there is no GPU
    for int8 in (True, smooth):
        _close_rows(act(p, int8=int8), want[int8 is True])
        _close_rows(act(dense, int8=int8), want[int8 is True])
    with pytest.raises(ValueError, match="int8="):
        act(p)


def test_a_linear_hands_its_product_and_its_output_from_it():
    g = torch.Generator().manual_seed(2)
    lin = torch.nn.Linear(32, 16, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(16, 32, generator=g))
    q = Int8Linear.from_linear(lin, None, torch.float32)
    x = torch.randn(5, 32, generator=g)
    assert torch.allclose(q.product(x).dense(), q(x), rtol=1e-6, atol=1e-6)
    with_bias = Int8Linear.from_linear(torch.nn.Linear(32, 16), None, torch.float32)
    with pytest.raises(ValueError, match="bias"):
        with_bias.product(x)


def test_the_kernels_round_ties_to_even_as_torch_does():
    from qcls.engine import int8_kernels as k8
    row = [127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.49, 3.51, -126.5, 126.5, 0.0, -0.49, 4.5, -4.5, 5.5]
    x = torch.tensor([row, [v / 2 for v in row]], device=DEVICE)  # scale 1 and 0.5: every .5 an exact tie
    q, s = k8.quantize_rows(x, None, impl="triton")
    want_q, want_s = k8.quantize_rows(x, None, impl="torch")
    assert torch.equal(q, want_q) and torch.equal(s, want_s)
    assert q[0, 1:7].tolist() == [0, 2, 2, 0, -2, -2]
