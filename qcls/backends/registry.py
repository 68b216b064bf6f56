"""Backend registry: name → "module:Class". Adding a backend = one file + one line here."""
from __future__ import annotations

import importlib

from qcls.backends.base import Backend
from qcls.errors import ConfigError

BACKENDS: dict[str, str] = {
    "fp16": "qcls.backends.fp16:Fp16Backend",
    "fp16-offload": "qcls.backends.offload:Fp16OffloadBackend",
    "int8": "qcls.backends.int8:Int8Backend",
    "bnb-int8": "qcls.backends.bnb:BnbInt8Backend",
    "bnb-nf4": "qcls.backends.bnb:BnbNf4Backend",
    "gptq": "qcls.backends.gptq:GptqBackend",
}


def get_backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise ConfigError(f"unknown backend {name!r}", f"known: {sorted(BACKENDS)} (override with backend=NAME)")
    module, cls = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)()
