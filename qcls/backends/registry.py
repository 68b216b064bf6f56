"""Backend registry: name → "module:Class". Adding a backend = one file + one line here."""
from __future__ import annotations

import importlib

from qcls.backends.base import Backend

BACKENDS: dict[str, str] = {
    "fp16": "qcls.backends.fp16:Fp16Backend",
}


def get_backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; known: {sorted(BACKENDS)}")
    module, cls = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)()
