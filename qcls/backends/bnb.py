"""bnb-int8 (LLM.int8) and bnb-nf4 (4-bit NF4, fp16 compute) through transformers' bitsandbytes integration.

A transformers checkpoint is quantized while it loads (`BitsAndBytesConfig`), so fp16 weights never sit on
the GPU whole. transformers refuses a quantization config together with a GGUF file, so a GGUF source is
dequantized on the CPU first and its decoder linears are then swapped for bitsandbytes modules, which
quantize as they move to the device: the same modules and kernels as the integration's.

CUDA graphs: 4-bit matmuls are capturable since bitsandbytes 0.44, int8 since 0.45, but only without
LLM.int8's outlier decomposition: with threshold > 0 every matmul looks for outlier columns with a
host-side check (`outliers.any()` then `argwhere`: a device sync and a data-dependent shape), which a
CUDA graph cannot hold. So threshold > 0 runs eagerly and says why; threshold 0 is pure int8 and captured.
"""
from __future__ import annotations

from importlib import metadata

import torch
from packaging import version

from qcls.backends import sources
from qcls.backends.base import Backend, LoadedModel, backend_options, module_bytes, resolve_device, resolve_dtype
from qcls.config import QclsConfig
from qcls.errors import DeviceError, MissingPackageError

INSTALL = "pip install 'bitsandbytes>=0.45' (or pip install 'qcls[bnb]')"


def bnb_version() -> str:
    try:
        import bitsandbytes  # noqa: F401
    except Exception as e:  # ImportError, or a broken native library
        raise MissingPackageError(f"backend bnb-int8 / bnb-nf4 needs bitsandbytes, which cannot be imported "
                                  f"({type(e).__name__}: {e})", f"install it with {INSTALL}") from None
    return metadata.version("bitsandbytes")


def quant_bytes(model: torch.nn.Module) -> int:
    """Bytes of bitsandbytes' quantization state (int8 row scales, 4-bit absmax), which lives on the
    weight objects rather than in parameters or buffers."""
    total = 0
    for p in model.parameters():
        scb = getattr(p, "SCB", None)
        if isinstance(scb, torch.Tensor):
            total += scb.numel() * scb.element_size()
        qs = getattr(p, "quant_state", None)
        while qs is not None:
            for t in (getattr(qs, "absmax", None), getattr(qs, "code", None)):
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
            qs = getattr(qs, "state2", None)
    return total


def quantize_in_place(model: torch.nn.Module, qc, device: torch.device) -> None:
    """Swap every linear of the decoder layers for its bitsandbytes module and place the whole model on
    `device` (the weights quantize as they move). The LM head stays unquantized, as in the integration."""
    import bitsandbytes as bnb
    for layer in model.model.layers:
        for parent in list(layer.modules()):
            for attr, mod in list(parent.named_children()):
                if type(mod) is not torch.nn.Linear:
                    continue
                w, bias = mod.weight.data, mod.bias is not None
                if qc.load_in_8bit:
                    new = bnb.nn.Linear8bitLt(mod.in_features, mod.out_features, bias=bias, has_fp16_weights=False,
                                              threshold=qc.llm_int8_threshold, device="meta")
                    new.weight = bnb.nn.Int8Params(w.to(torch.float16), requires_grad=False, has_fp16_weights=False)
                else:
                    new = bnb.nn.Linear4bit(mod.in_features, mod.out_features, bias=bias,
                                            compute_dtype=qc.bnb_4bit_compute_dtype,
                                            compress_statistics=qc.bnb_4bit_use_double_quant,
                                            quant_type=qc.bnb_4bit_quant_type, device="meta")
                    new.weight = bnb.nn.Params4bit(w, requires_grad=False, quant_type=qc.bnb_4bit_quant_type,
                                                   compress_statistics=qc.bnb_4bit_use_double_quant)
                if bias:
                    new.bias = torch.nn.Parameter(mod.bias.data.to(device), requires_grad=False)
                new.weight = new.weight.to(device)
                new.train(mod.training)  # bitsandbytes picks other (dequantising) kernels in training mode
                setattr(parent, attr, new)
    moved: dict[int, torch.nn.Parameter] = {}  # keeps a tied head tied
    for m in model.modules():
        if isinstance(m, (bnb.nn.Linear8bitLt, bnb.nn.Linear4bit)):
            continue
        for name, p in list(m.named_parameters(recurse=False)):
            if id(p) not in moved:
                moved[id(p)] = torch.nn.Parameter(p.data.to(device), requires_grad=False)
            m._parameters[name] = moved[id(p)]
        for name, b in list(m.named_buffers(recurse=False)):
            m._buffers[name] = b.to(device)


class _BnbBackend(Backend):
    name = "bnb"
    defaults: dict = {}
    min_capture = "0"

    def quant_config(self, opts: dict, dtype: torch.dtype):
        raise NotImplementedError

    def capture(self, ver: str, opts: dict) -> tuple[bool, list[str]]:
        if version.parse(ver) < version.parse(self.min_capture):
            return False, [f"{self.name}: bitsandbytes {ver} cannot be captured in a CUDA graph (needs >= "
                           f"{self.min_capture}); the forward runs eagerly. Upgrade: {INSTALL}"]
        return True, []

    def load(self, cfg: QclsConfig, layers: int | None = None, tokenizer=None) -> LoadedModel:
        device = resolve_device(cfg)
        dtype = resolve_dtype(cfg, device)
        opts = backend_options(cfg, self.defaults)
        ver = bnb_version()
        qc = self.quant_config(opts, dtype)
        src = self.source(cfg)
        est = self.preflight(cfg, src, device, layers)
        tokenizer = sources.load_tokenizer(src) if tokenizer is None else tokenizer
        try:
            if src.gguf_file:
                model = sources.load_model(src, dtype, layers)
                quantize_in_place(model, qc, device)
            else:
                model = sources.load_model(src, dtype, layers, quantization_config=qc, device_map={"": str(device)})
        except (RuntimeError, NotImplementedError) as e:
            if device.type == "cuda":
                raise
            raise DeviceError(f"{self.name}: bitsandbytes {ver} could not quantize or run on the CPU ({e})",
                              "run on a CUDA GPU (backend.device=cuda) or use backend=fp16 on the CPU") from e
        notes: list[str] = []
        capturable = True
        if device.type == "cuda":
            capturable, notes = self.capture(ver, opts)
        memory = module_bytes(model)
        key = "weights_gpu" if device.type == "cuda" else "weights_cpu"
        memory[key] = memory.get(key, 0) + quant_bytes(model)
        if est is not None:
            memory.update(est.as_dict())
        return LoadedModel(model, tokenizer, device, dtype, self.name, graph_capturable=capturable, notes=notes,
                           memory=memory)


class BnbInt8Backend(_BnbBackend):
    name = "bnb-int8"
    defaults = {"threshold": 6.0}
    min_capture = "0.45"

    def quant_config(self, opts: dict, dtype: torch.dtype):
        from transformers import BitsAndBytesConfig
        t = float(opts["threshold"])
        if t < 0:
            raise ValueError(f"backend bnb-int8: threshold must be >= 0, got {t}")
        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=t)

    def capture(self, ver: str, opts: dict) -> tuple[bool, list[str]]:
        ok, notes = super().capture(ver, opts)
        if ok and float(opts["threshold"]) > 0:
            return False, [f"bnb-int8: LLM.int8 outlier decomposition (threshold={float(opts['threshold'])}) "
                           "searches every matmul's input for outlier columns with a host-side check, which a "
                           "CUDA graph cannot hold: the forward runs eagerly. backend.options.threshold=0 (pure "
                           "int8, no fp16 outlier path) is graph-capturable"]
        return ok, notes


class BnbNf4Backend(_BnbBackend):
    name = "bnb-nf4"
    defaults = {"quant_type": "nf4", "double_quant": False}
    min_capture = "0.44"

    def quant_config(self, opts: dict, dtype: torch.dtype):
        from transformers import BitsAndBytesConfig
        if opts["quant_type"] not in ("nf4", "fp4"):
            raise ValueError(f"backend bnb-nf4: quant_type must be nf4 or fp4, got {opts['quant_type']!r}")
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=opts["quant_type"],
                                  bnb_4bit_compute_dtype=dtype, bnb_4bit_use_double_quant=bool(opts["double_quant"]))
