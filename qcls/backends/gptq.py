"""gptq: pre-quantized GPTQ (int4 / int8) and AWQ checkpoints through transformers' GPTQ / AWQ integration,
which runs on GPTQModel (the maintained successor of auto-gptq; GPTQ also needs optimum).

The kernel is GPTQModel's choice unless `backend.options.kernel` names one. On a T4 (sm_75): `torch`
(dequantise + cuBLAS, no compilation) always runs; `marlin` (fp16 only on sm_75) and `exllama_v2` are
JIT-compiled at first use and need nvcc (CUDA toolkit ≥ 12.8 for Marlin's flags); `triton` runs but
Triton's `tl.dot` has no tensor cores below sm_80. See docs/backends.md for the findings.

`write_gptq_checkpoint` turns a plain fp16 checkpoint into a GPTQ-format one by round-to-nearest
quantization (no calibration): the benchmark's way to get GPTQ weights that match the fp16 weights it
compares against. `write_awq_checkpoint` does the same into AWQ's 4-bit "gemm" format (asymmetric,
no activation-aware scaling).
"""
from __future__ import annotations

import json
import shutil
from importlib import metadata
from pathlib import Path

import torch

from qcls.backends import sources
from qcls.backends.base import Backend, LoadedModel, backend_options, module_bytes, resolve_device
from qcls.config import QclsConfig
from qcls.errors import MissingPackageError

INSTALL = "pip install gptqmodel optimum (GPTQModel compiles its CUDA kernels at first use: needs nvcc)"
KERNELS = {  # backend.options.kernel → (GPTQ backend, AWQ backend) names of the integration
    "auto": ("auto", "auto"),
    "torch": ("torch", "torch_awq"),
    "marlin": ("marlin", "marlin"),
    "exllama_v2": ("exllama_v2", "exllama_v2"),
    "triton": ("triton", "gemm_triton"),
}


def require_gptqmodel(method: str) -> str:
    """GPTQModel's version, or an ImportError naming the install command."""
    missing = []
    for mod, dist in (("gptqmodel", "gptqmodel"), ("optimum", "optimum")):
        if method == "awq" and mod == "optimum":
            continue
        try:
            __import__(mod)
        except Exception as e:  # ImportError, or a kernel build / native library failure at import
            missing.append(f"{dist} ({type(e).__name__}: {e})")
    if missing:
        raise MissingPackageError(f"backend gptq needs {', '.join(missing)}",
                                  f"install with {INSTALL}; for a plain fp16 checkpoint use backend=bnb-int8 or "
                                  "bnb-nf4 instead")
    return metadata.version("gptqmodel")


def checkpoint_quant(model_config) -> dict:
    q = getattr(model_config, "quantization_config", None)
    q = q if isinstance(q, dict) or q is None else q.to_dict()
    if not q or str(q.get("quant_method", "")).lower() not in ("gptq", "awq"):
        raise ValueError("backend gptq loads pre-quantized GPTQ or AWQ checkpoints, and this model's config.json "
                         "has no quantization_config with quant_method gptq or awq; for a plain fp16 checkpoint "
                         "use backend=bnb-int8 or bnb-nf4 (quantized at load), or fp16-offload")
    return q


class GptqBackend(Backend):
    name = "gptq"
    defaults = {"kernel": "auto"}

    def load(self, cfg: QclsConfig, layers: int | None = None, tokenizer=None) -> LoadedModel:
        device = resolve_device(cfg)
        opts = backend_options(cfg, self.defaults)
        kernel = str(opts["kernel"]).lower()
        if kernel not in KERNELS:
            raise ValueError(f"backend gptq: unknown kernel {kernel!r}; known: {sorted(KERNELS)}")
        src = self.source(cfg)
        if src.gguf_file:
            raise ValueError("backend gptq reads GPTQ/AWQ checkpoints; a GGUF source is served by fp16, "
                             "fp16-offload, bnb-int8 or bnb-nf4 (re-quantized at load)")
        q = checkpoint_quant(sources.load_config(src))
        method = str(q["quant_method"]).lower()
        ver = require_gptqmodel(method)
        est = self.preflight(cfg, src, device, layers)
        from transformers import AwqConfig, GPTQConfig
        cls = AwqConfig if method == "awq" else GPTQConfig
        override = cls.from_dict({**q, "backend": KERNELS[kernel][method == "awq"]})
        # GPTQ kernels compute in fp16 (bf16 is unusable on a T4 and Marlin on sm_75 is fp16-only).
        dtype = torch.float16
        notes = []
        if device.type == "cpu":
            notes.append("gptq on the CPU computes in float16 (GPTQModel's kernels take fp16/bf16 only)")
        tokenizer = sources.load_tokenizer(src) if tokenizer is None else tokenizer
        model = sources.load_model(src, dtype, layers, quantization_config=override, device_map={"": str(device)})
        kernels = sorted({type(m).__name__ for m in model.model.layers[0].modules() if hasattr(m, "qweight")})
        memory = module_bytes(model)
        if est is not None:
            memory.update(est.as_dict())
        if not kernels:
            raise RuntimeError(f"backend gptq: GPTQModel {ver} loaded {src.path} without quantized linear modules")
        return LoadedModel(model, tokenizer, device, dtype, self.name, notes=notes, memory=memory)


def _rtn_pack(w: torch.Tensor, bits: int, group: int) -> dict[str, torch.Tensor]:
    """Symmetric round-to-nearest GPTQ tensors (checkpoint_format "gptq", v1) for a [out, in] weight."""
    n, k = w.shape
    if k % group or (32 % bits) or k % (32 // bits) or n % (32 // bits):
        raise ValueError(f"cannot pack a [{n}, {k}] weight at {bits} bits, group {group}")
    maxq, per = 2 ** bits - 1, 32 // bits
    wg = w.float().t().reshape(k // group, group, n)
    scale = (2 * wg.abs().amax(1) / maxq).clamp_min(1e-8)  # [groups, n], GPTQ's sym scale
    zero = (maxq + 1) // 2
    q = (torch.round(wg / scale[:, None]) + zero).clamp(0, maxq).to(torch.int32).reshape(k, n)
    qweight = torch.zeros(k // per, n, dtype=torch.int32, device=w.device)
    for j in range(per):
        qweight |= q[j::per] << (bits * j)
    z = torch.full((k // group, n), zero - 1, dtype=torch.int32, device=w.device)  # v1 stores zero - 1
    qzeros = torch.zeros(k // group, n // per, dtype=torch.int32, device=w.device)
    for j in range(per):
        qzeros |= z[:, j::per] << (bits * j)
    g_idx = torch.arange(k, dtype=torch.int32, device=w.device) // group
    return {"qweight": qweight.cpu(), "qzeros": qzeros.cpu(), "scales": scale.half().cpu(), "g_idx": g_idx.cpu()}


def write_gptq_checkpoint(src: str | Path, out: str | Path, bits: int = 4, group_size: int = 128,
                          device: str = "cpu") -> Path:
    """GPTQ-format copy of a plain safetensors checkpoint: every decoder `*_proj.weight` RTN-quantized and
    packed, everything else (embedding, norms, LM head) kept in fp16. Tokenizer files are copied."""
    return _write_packed(src, out, lambda w: _rtn_pack(w.to(device), bits, group_size),
                         {"quant_method": "gptq", "bits": bits, "group_size": group_size, "desc_act": False,
                          "sym": True, "checkpoint_format": "gptq"})


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AWQ "gemm" int4 interleave of the 8 codes in one int32


def _awq_pack(w: torch.Tensor, group: int) -> dict[str, torch.Tensor]:
    """Asymmetric 4-bit round-to-nearest AWQ "gemm" tensors for a [out, in] weight: qweight [in, out/8] and
    qzeros [in/group, out/8] packed along the output dim in AWQ_ORDER, scales fp16 [in/group, out];
    weight = (q - zero) * scale."""
    n, k = w.shape
    if k % group or n % 8:
        raise ValueError(f"cannot AWQ-pack a [{n}, {k}] weight at group {group}")
    wg = w.float().t().reshape(k // group, group, n)
    lo, hi = wg.amin(1).clamp(max=0), wg.amax(1).clamp(min=0)  # [groups, n], range includes 0
    scale = ((hi - lo) / 15).clamp_min(1e-8).half()  # the kernel computes with the fp16 scale
    zero = torch.round(-lo / scale.float()).clamp(0, 15)
    q = (torch.round(wg / scale.float()[:, None]) + zero[:, None]).clamp(0, 15).reshape(k, n)

    def pack(c: torch.Tensor) -> torch.Tensor:
        c = c.to(torch.int32).reshape(c.shape[0], n // 8, 8)[..., AWQ_ORDER]
        return sum(c[..., j] << (4 * j) for j in range(8)).to(torch.int32).contiguous().cpu()
    return {"qweight": pack(q), "qzeros": pack(zero), "scales": scale.cpu()}


def write_awq_checkpoint(src: str | Path, out: str | Path, group_size: int = 128, device: str = "cpu") -> Path:
    """AWQ-format ("gemm", 4-bit, zero point) copy of a plain safetensors checkpoint by round-to-nearest (no
    activation-aware scaling): the decoder `*_proj.weight`s packed, everything else kept in fp16."""
    return _write_packed(src, out, lambda w: _awq_pack(w.to(device), group_size),
                         {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True,
                          "version": "gemm"})


def _write_packed(src: str | Path, out: str | Path, pack, quantization_config: dict) -> Path:
    from safetensors import safe_open
    from safetensors.torch import save_file
    src, out = Path(src), Path(out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    weight_map: dict[str, str] = {}
    for f in sorted(src.glob("*.safetensors")):
        tensors: dict[str, torch.Tensor] = {}
        with safe_open(str(f), framework="pt", device="cpu") as st:
            for name in st.keys():
                t = st.get_tensor(name)
                if ".layers." in name and name.endswith("_proj.weight"):
                    for suffix, v in pack(t).items():
                        tensors[name[: -len("weight")] + suffix] = v
                else:
                    tensors[name] = t.half() if t.is_floating_point() else t
        save_file(tensors, str(out / f.name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, f.name))
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copy(f, out / f.name)
    if (src / "model.safetensors.index.json").is_file():
        (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"] = quantization_config
    cfg["dtype"] = "float16"
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out
