"""The calibrated W8A8 weights kept on disk, so that a later start with the same weights, calibration text and
options reads them instead of calibrating again (tens of seconds on a 2-core CPU, the same order on a T4).

A file holds every Int8Linear's buffers and the calibration's report. It is named by two hashes:

- the weights': the heads' fingerprint (embedding rows, norms) and a strided sample of every decoder linear's
  weight, so a fine-tune that changes only the linears gets a file of its own;
- the calibration's: the token ids it ran over (the prompts, the queries, the token budget), the options that
  choose the quantization, the model's dtype and the device kind, and FORMAT.

The KEEP most recently used files of one model's weights stay (a file is as large as the int8 weights: ~0.1 GB for
the demo models, ~7 GB for Qwen3-8B); older ones are removed when a new one is written. Files are written whole and
renamed into place (sources.atomic_file), so two processes calibrating at once leave one complete file.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from torch import nn

from qcls.backends.int8_calibration import GROUPS, Int8Report, parent_of
from qcls.backends.sources import atomic_file
from qcls.engine.int8_linear import Int8Linear
from qcls.heads.weights_fingerprint import weights_fingerprint

FORMAT = 1  # raised when the quantization's arithmetic or the file's layout changes
KEEP = 2
SAMPLE = 4096  # values hashed per decoder linear
BUFFERS = ("qweight", "wscale", "bias", "smooth")


@torch.inference_mode()
def weights_key(model: nn.Module) -> str:
    h = hashlib.sha256(weights_fingerprint(model).encode())
    for i, layer in enumerate(model.model.layers):
        for group in GROUPS:
            for name in group:
                w = getattr(parent_of(layer, name), name).weight
                flat = w.detach().reshape(-1)
                h.update(f"{i}.{name}{tuple(w.shape)}".encode())
                h.update(flat[::max(1, flat.numel() // SAMPLE)].to("cpu", torch.float16).numpy().tobytes())
    return h.hexdigest()[:16]


def calibration_key(ids: torch.Tensor, mask: torch.Tensor, opts: dict, dtype: torch.dtype,
                    device: torch.device) -> str:
    h = hashlib.sha256()
    h.update(ids.to(torch.int64).numpy().tobytes())
    h.update(mask.to(torch.int64).numpy().tobytes())
    h.update(repr((FORMAT, tuple(ids.shape), [float(a) for a in opts["alphas"]], float(opts["max_error"]),
                   str(dtype), device.type)).encode())
    return h.hexdigest()[:16]


def path_for(root: Path, weights: str, calibration: str) -> Path:
    return root / "int8" / f"{weights}-{calibration}.safetensors"


def read(path: Path, model: nn.Module, dtype: torch.dtype) -> Int8Report | None:
    """Put the file's Int8Linear modules into `model` (on the CPU); None where there is no file. A file that does
    not fit the model raises ValueError before the model is changed."""
    if not path.is_file():
        return None
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        if meta.get("format") != str(FORMAT):
            raise ValueError(f"format {meta.get('format')!r}, not {FORMAT}")
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    report = Int8Report(**json.loads(meta["report"]))
    report.alphas = {float(a): n for a, n in report.alphas.items()}
    modules = {}
    for prefix in sorted({k.rsplit(".", 1)[0] for k in tensors}):
        parent_name, name = prefix.rsplit(".", 1)
        old = model.get_submodule(prefix)
        q = tensors[f"{prefix}.qweight"]
        if not isinstance(old, nn.Linear) or tuple(q.shape) != (old.out_features, old.in_features):
            raise ValueError(f"{prefix}: {tuple(q.shape)} does not fit this model's {old}")
        modules[prefix] = (model.get_submodule(parent_name), name, Int8Linear(
            q, tensors[f"{prefix}.wscale"], tensors.get(f"{prefix}.bias"), tensors.get(f"{prefix}.smooth"), dtype))
    if len(modules) != report.int8:
        raise ValueError(f"{len(modules)} linears in the file, its report says {report.int8}")
    for parent, name, mod in modules.values():
        setattr(parent, name, mod)
    try:
        os.utime(path)  # the most recently used files are the ones kept
    except OSError:  # a read-only cache (one prepared for a container) is read all the same
        pass
    return report


def write(path: Path, model: nn.Module, report: Int8Report) -> None:
    from safetensors.torch import save_file
    # copies: the linears of a group share one smoothing vector, and a file holds no shared tensors
    tensors = {f"{prefix}.{b}": getattr(mod, b).detach().to("cpu", copy=True).contiguous()
               for prefix, mod in model.named_modules() if isinstance(mod, Int8Linear)
               for b in BUFFERS if getattr(mod, b) is not None}
    meta = {"format": str(FORMAT), "report": json.dumps({**report.__dict__, "alphas": {
        str(a): n for a, n in report.alphas.items()}})}
    with atomic_file(path) as tmp:  # streamed to disk: a Qwen3-8B file is never held in memory as bytes
        save_file(tensors, str(tmp), metadata=meta)
    weights = path.name.split("-", 1)[0]
    same = sorted(path.parent.glob(f"{weights}-*.safetensors"), key=_used, reverse=True)
    for old in same[KEEP:]:
        old.unlink(missing_ok=True)


def _used(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except FileNotFoundError:  # removed by another process's write a moment ago
        return 0.0
