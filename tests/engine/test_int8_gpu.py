"""GPU, backend=int8: the Triton kernels that emit int8 rows and scale the int32 GEMM back equal their torch
definitions; the engine (fused norms, CUDA graphs) equals the eager int8 reference forward; nothing is allocated on
the request path. Run with `pytest -m gpu`."""
from __future__ import annotations

import pytest
import torch

from qcls.backends.registry import get_backend
from qcls.classifier import Classifier
from qcls.engine import int8_kernels as k8
from qcls.engine.int8_linear import int_mm
from qcls.engine.act_kernels import gelu_tanh_mul, silu_mul
from qcls.engine.kernels import add_rmsnorm, post_add_rmsnorm
from tests.backends.helpers import cfg, scores

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _need_cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: run on a GPU machine")


def _close_int8(a: tuple, b: tuple) -> None:
    """int8 rows equal up to a rounding step where float32 sums differ in order; scales equal to float32 precision."""
    assert (a[0].int() - b[0].int()).abs().max() <= 1
    assert (a[0] != b[0]).float().mean() < 1e-3
    assert torch.allclose(a[1], b[1], rtol=1e-5)


@pytest.mark.parametrize("h", [640, 2560, 4096])
def test_norm_kernels_emit_the_rows_quantize_rows_gives(h):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(37, h, device="cuda", generator=g).half()
    r = torch.randn(37, h, device="cuda", generator=g)
    w = torch.rand(h, device="cuda", generator=g).half()
    m = torch.rand(h, device="cuda", generator=g) + 0.5
    for smooth in (m, True):
        got, s = add_rmsnorm(x, r, w, 1e-6, torch.float16, int8=smooth)
        want, s2 = add_rmsnorm(x, r, w, 1e-6, torch.float16, impl="torch", int8=smooth)
        _close_int8(got, want)
        assert torch.allclose(s, s2)
        got, _ = post_add_rmsnorm(x, r, w, 1e-6, w, 1e-6, torch.float16, offset=True, int8=smooth)
        want, _ = post_add_rmsnorm(x, r, w, 1e-6, w, 1e-6, torch.float16, offset=True, impl="torch", int8=smooth)
        _close_int8(got, want)


@pytest.mark.parametrize("inter", [2048, 9728, 12288])
def test_activation_kernel_emits_the_rows_quantize_rows_gives(inter):
    gu = torch.randn(21, 2 * inter, device="cuda").half()
    m = torch.rand(inter, device="cuda") + 0.5
    for fn in (silu_mul, gelu_tanh_mul):
        got = fn(gu, int8=m)
        want = k8.quantize_rows_torch(fn(gu).float(), m)  # the float path rounds to fp16 first: one step apart
        assert (got[0].int() - want[0].int()).abs().max() <= 1


def test_quantize_and_dequantize_kernels_equal_torch():
    x = torch.randn(40, 1024, device="cuda").half()
    m = torch.rand(1024, device="cuda") + 0.5
    _close_int8(k8.quantize_rows(x, m), k8.quantize_rows(x, m, impl="torch"))
    acc = torch.randint(-2**20, 2**20, (40, 1536), device="cuda", dtype=torch.int32)
    xs, ws, b = torch.rand(40, device="cuda"), torch.rand(1536, device="cuda"), torch.randn(1536, device="cuda")
    for bias in (None, b):
        got = k8.dequantize(acc, xs, ws, bias, torch.float16)
        assert torch.allclose(got.float(), k8.dequantize(acc, xs, ws, bias, torch.float16, impl="torch").float(),
                              rtol=1e-3)


def test_int_mm_on_the_gpu_is_exact_also_below_17_rows():
    for m in (1, 8, 16, 17, 126):
        q = torch.randint(-127, 128, (m, 256), device="cuda", dtype=torch.int8)
        w = torch.randint(-127, 128, (512, 256), device="cuda", dtype=torch.int8)
        exact = (q.cpu().long() @ w.cpu().long().t()).int()  # CUDA has no int64 matmul: the reference on the CPU
        assert torch.equal(int_mm(q, w).cpu(), exact)


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_int8_engine_with_graphs_equals_the_eager_int8_reference(tiny_dirs, family):
    c = cfg(tiny_dirs[family], "int8", {"calibration_tokens": 256}, device="cuda")
    loaded = get_backend("int8").load(c)
    fast = Classifier(c, loaded=loaded)
    assert fast.metadata()["graphs"]
    ref = Classifier(cfg(tiny_dirs[family], "int8", {"calibration_tokens": 256}, device="cuda",
                         engine={"kind": "reference"}), loaded=loaded)
    got, want = scores(fast), scores(ref)
    # fp16 activations on both sides (transformers' rounds every step, the engine's residual is float32): a few
    # int8 values one step apart
    assert (got - want).abs().max() < 0.05 * want.abs().max()


def test_int8_request_path_allocates_nothing(tiny_dirs):
    clf = Classifier(cfg(tiny_dirs["qwen3"], "int8", {"calibration_tokens": 256}, device="cuda"))
    clf.classify(["warm"])
    before = torch.cuda.memory_stats()
    for i in range(12):
        clf.classify(["red dress", "boys hoodie size 140", "x", "夏季女士碎花连衣裙"][: 1 + i % 4])
    after = torch.cuda.memory_stats()
    assert after["allocation.all.allocated"] == before["allocation.all.allocated"]
    assert after["segment.all.allocated"] == before["segment.all.allocated"]
