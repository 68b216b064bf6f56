"""W8A8 linear layers: int8 weights with one scale per output channel, activations quantized per token at run time,
the product on the int8 GEMM (cuBLASLt through `torch._int_mm` on CUDA, oneDNN/VNNI on the CPU), the two scales
applied to its int32 result in one step.

    y = (q(x · m) @ Wq^T) · s_x[:, None] · s_w[None, :] + b,    q(t) = round(t / s_x), s_x = max_j |t_j| / 127

`m` (the smoothing vector, SmoothQuant's 1/s) moves activation outliers into the weights: W was multiplied by
1/m column by column when it was quantized, so x · m @ (W / m)^T = x @ W^T before rounding. It is applied where the
activation is quantized, not folded into the preceding norm, so the model's own norm weights (which a head's weight
fingerprint hashes) stay as they are.

The activation's quantization is done by the kernel that produces it where the decoder can (the RMSNorms and the
gated activation emit `QuantizedRows` on a GPU: qcls/engine/int8_kernels.py); a float input is quantized here.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from qcls.engine import int8_kernels as k8

# cuBLASLt's int8 GEMM (torch._int_mm) takes more than 16 rows; fewer are padded with zero rows
MIN_ROWS_CUDA = 17


@dataclass
class QuantizedRows:
    """An activation quantized per row: q [M, K] int8, scale [M] float32 (q · scale ≈ the activation)."""
    q: torch.Tensor
    scale: torch.Tensor


def shapes_ok(in_features: int, out_features: int) -> bool:
    """Whether the int8 GEMM takes this linear (K and N multiples of 8: cuBLASLt's int8 layouts)."""
    return in_features % 8 == 0 and out_features % 8 == 0


def quantize_weight(w: torch.Tensor, smooth: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 [N, K], float32 [N]) symmetric per output channel, of w / smooth (column-wise) when smooth is given."""
    w = w.detach().float()
    if smooth is not None:
        w = w / smooth.float()[None, :]
    scale = w.abs().amax(1).clamp_min(1e-12) / 127.0
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


class Int8Linear(nn.Module):
    """A decoder linear in W8A8. Weights and scales are buffers (not parameters): nothing here trains."""

    def __init__(self, qweight: torch.Tensor, wscale: torch.Tensor, bias: torch.Tensor | None,
                 smooth: torch.Tensor | None, out_dtype: torch.dtype):
        super().__init__()
        if qweight.dtype != torch.int8 or qweight.dim() != 2:
            raise ValueError("Int8Linear needs an int8 [out, in] weight")
        self.out_features, self.in_features = qweight.shape
        if not shapes_ok(self.in_features, self.out_features):
            raise ValueError(f"the int8 GEMM needs in/out features that are multiples of 8, got "
                             f"{self.in_features} → {self.out_features}")
        self.register_buffer("qweight", qweight.contiguous())
        self.register_buffer("wscale", wscale.float().contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())
        self.register_buffer("smooth", None if smooth is None else smooth.float().contiguous())
        self.out_dtype = out_dtype
        # the CPU's packed copy of qweight (packed_gemm), made by the first forward there: the start-up's warm-up (the
        # modules joined into one GEMM are the ones that run; their parts never pack a copy)
        self._packed = None

    @classmethod
    def from_linear(cls, lin: nn.Linear, smooth: torch.Tensor | None, out_dtype: torch.dtype) -> "Int8Linear":
        q, s = quantize_weight(lin.weight, smooth)
        return cls(q, s, lin.bias, smooth, out_dtype)

    @staticmethod
    def joinable(mods: list[nn.Module]) -> bool:
        """Whether these W8A8 linears can run as one GEMM (q/k/v, gate/up): one input, so one quantization of it
        (the same smoothing vector, which one calibration of their common input gives them)."""
        first = mods[0]
        return all(isinstance(m, Int8Linear) and m.in_features == first.in_features and m.out_dtype == first.out_dtype
                   and m.qweight.device == first.qweight.device and (m.bias is None) == (first.bias is None)
                   and _same(m.smooth, first.smooth) for m in mods)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, smoothed={self.smooth is not None}"

    def quantize(self, x: torch.Tensor) -> QuantizedRows:
        q, s = k8.quantize_rows(x, self.smooth)
        return QuantizedRows(q, s)

    def forward(self, x: torch.Tensor | QuantizedRows) -> torch.Tensor:
        a = x if isinstance(x, QuantizedRows) else self.quantize(x.reshape(-1, self.in_features))
        out = k8.dequantize(self._gemm(a.q), a.scale, self.wscale, self.bias, self.out_dtype)
        return out if isinstance(x, QuantizedRows) else out.view(*x.shape[:-1], self.out_features)

    def product(self, x: torch.Tensor | QuantizedRows) -> k8.Int32Product:
        """The output before its scales (x 2-D): for the kernel that reads it next, which applies them (no bias)."""
        if self.bias is not None:
            raise ValueError("a linear with a bias hands its output dequantized (forward)")
        a = x if isinstance(x, QuantizedRows) else self.quantize(x)
        return k8.Int32Product(self._gemm(a.q), a.scale, self.wscale)

    def _gemm(self, q: torch.Tensor) -> torch.Tensor:
        """q @ qweight^T, exact: int32 on CUDA; on the CPU the same integers as float32 values where oneDNN's packed
        kernel is exact there (cpu_gemm), which is what the scales are applied to next either way."""
        if q.is_cuda or cpu_gemm()[0] != "onednn":
            return int_mm(q, self.qweight)
        if self._packed is None:
            self._packed = torch.ops.onednn.qlinear_prepack(self.qweight.contiguous(), [q.shape[0], self.in_features])
        return packed_gemm(q, self._packed, self.out_features)


def int_mm(q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """q [M, K] int8 @ w [N, K]^T → int32 [M, N], exact (int32 accumulation)."""
    m = q.shape[0]
    if q.is_cuda and m < MIN_ROWS_CUDA:
        pad = torch.zeros(MIN_ROWS_CUDA - m, q.shape[1], dtype=q.dtype, device=q.device)
        return torch._int_mm(torch.cat([q, pad]), w.t())[:m]
    return torch._int_mm(q, w.t())


def packed_gemm(q: torch.Tensor, packed: torch.Tensor, n: int) -> torch.Tensor:
    """q [M, K] int8 @ the packed weight → float32 [M, N] holding the int32 products (rounded to float32 as
    acc.float() rounds them). oneDNN's x86 int8 kernel takes unsigned activations: q + 128 (its bits with the top
    one flipped) with zero point 128, which it subtracts exactly; unit scales leave the integers as they are."""
    ones, zeros = _unit_scales(n)
    return torch.ops.onednn.qlinear_pointwise(q.view(torch.uint8).bitwise_xor(128), 1.0, 128, packed, ones, zeros,
                                              None, 1.0, 0, torch.float32, "none", [None], "")


@functools.cache
def _unit_scales(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ones(n), torch.zeros(n, dtype=torch.long)


@functools.cache
def cpu_gemm() -> tuple[str, str]:
    """(kernel, why) of the CPU's int8 GEMM: oneDNN's packed u8·s8 kernel (on the 2-core machine's AVX-512 VNNI
    1.2 ms of the demo's 9.3 ms of int8 GEMMs per query saved, a third at four) where it is there and gives the
    exact products on this CPU (without VNNI, x86 pairs u8·s8 products in 16 bits, which can saturate), else
    torch._int_mm (said at start-up). Checked once, on products at the extremes."""
    if not (hasattr(torch.ops.onednn, "qlinear_prepack") and torch.backends.mkldnn.is_available()):
        return "int_mm", "this torch build has no oneDNN int8 linear"
    g = torch.Generator().manual_seed(0)
    q = torch.randint(-127, 128, (24, 256), generator=g, dtype=torch.int8)
    w = torch.randint(-127, 128, (64, 256), generator=g, dtype=torch.int8)
    q[:4], w[:4] = 127, 127
    q[4:8], w[4:8] = -127, -127  # every pair at its largest: where 16-bit pair sums saturate
    try:
        got = packed_gemm(q, torch.ops.onednn.qlinear_prepack(w, list(q.shape)), w.shape[0])
    except RuntimeError as e:
        return "int_mm", f"oneDNN's int8 linear failed here ({str(e).splitlines()[0][:80]})"
    if not torch.equal(got, (q.long() @ w.long().t()).float()):
        return "int_mm", "oneDNN's int8 linear is not exact on this CPU"
    return "onednn", "oneDNN's packed int8 linear"


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a is b or (a.shape == b.shape and torch.equal(a, b))
