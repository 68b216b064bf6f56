"""Backend registry: name → "module:Class". Adding a backend = one file + one line here.

`auto`, the default, is not a backend of its own: it names int8 on a CPU and fp16 on a GPU (`resolved_name`)."""
from __future__ import annotations

import importlib

import torch

from qcls.backends.base import Backend, resolve_device
from qcls.config import QclsConfig
from qcls.errors import ConfigError

BACKENDS: dict[str, str] = {
    "fp16": "qcls.backends.fp16:Fp16Backend",
    "fp16-offload": "qcls.backends.offload:Fp16OffloadBackend",
    "int8": "qcls.backends.int8:Int8Backend",
    "bnb-int8": "qcls.backends.bnb:BnbInt8Backend",
    "bnb-nf4": "qcls.backends.bnb:BnbNf4Backend",
    "gptq": "qcls.backends.gptq:GptqBackend",
}
AUTO = "auto"


def get_backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise ConfigError(f"unknown backend {name!r}",
                          f"known: {sorted(BACKENDS)} or {AUTO} (override with backend=NAME)")
    module, cls = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)()


def resolved_name(cfg: QclsConfig, device: torch.device | None = None) -> str:
    """The backend `cfg` runs on `device` (default: the one it resolves to). `auto` is int8 on a CPU, where its
    W8A8 GEMMs on the int8 units answer the demo 2.4–2.9× faster than float32 with the head's accuracy within
    0.01, and fp16 on a GPU, where int8 was measured faster than fp16 at one query only (docs/backends.md)."""
    if cfg.backend.name != AUTO:
        return cfg.backend.name
    if (device or resolve_device(cfg)).type == "cpu":
        return "int8"
    from qcls.backends.int8 import DEFAULTS  # auto's options are int8's, for the CPU
    changed = sorted(k for k, v in cfg.backend.options.items() if DEFAULTS.get(k, v) != v or k not in DEFAULTS)
    if changed:
        raise ConfigError(f"backend auto runs fp16 on a GPU, and backend.options {changed} are int8's, which auto "
                          "runs on a CPU only", "backend=int8 runs int8 on this GPU with them; or drop them")
    return "fp16"


def backend_for(cfg: QclsConfig) -> Backend:
    return get_backend(resolved_name(cfg))
