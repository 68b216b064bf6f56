"""One loaded model kept across the jobs of a sweep process, so a sweep over strategies, prompts, engine or
calibration settings reads the weights once. Only one model is held at a time: a job that needs other
weights frees the previous ones first."""
from __future__ import annotations

import gc
import json
from typing import Any

import torch

from qcls.backends.base import LoadedModel, resolve_device
from qcls.config import QclsConfig

_held: tuple[str, LoadedModel] | None = None


def model_key(cfg: QclsConfig) -> str:
    """What decides the loaded weights: the model, the backend (name, device, dtype, options) and the cache
    directory of converted checkpoints. Everything else (scoring, prompts, engine, calibration) is built on
    top of a LoadedModel at engine build time."""
    key: dict[str, Any] = {"model": cfg.model.model_dump(), "backend": cfg.backend.model_dump(),
                           "device": str(resolve_device(cfg)), "cache_dir": cfg.cache_dir}
    return json.dumps(key, sort_keys=True, default=str)


def free_memory(weights: bool = False) -> None:
    """On a GPU: collect what the previous job left (engines, graphs, K/V buffers, held in reference cycles) and
    hand the cached blocks back before the next job allocates. On the CPU only when model weights were let go
    (`weights`), before another model's are read: a job's engine is freed by reference counting and its cycles by
    Python's collector in its own time, while a forced full collection of a process holding a model and a large
    tokenizer takes up to a second, several times per job."""
    if weights or torch.cuda.is_available():
        gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def take(cfg: QclsConfig) -> LoadedModel | None:
    """The held model when it serves `cfg`; otherwise free it (before the caller loads another) → None."""
    key = model_key(cfg)
    if _held is not None and _held[0] == key:
        free_memory()
        return _held[1]
    release()
    return None


def keep(cfg: QclsConfig, loaded: LoadedModel) -> None:
    global _held
    _held = (model_key(cfg), loaded)


def release() -> None:
    global _held
    held, _held = _held, None
    free_memory(weights=held is not None)


def budget_check(cfg: QclsConfig, loaded: LoadedModel) -> None:
    """A reused model skips the backend's pre-load memory check, but that check also counts the engine's
    buffers, which depend on prompts and buckets: run it again for this job's config (CUDA only)."""
    if loaded.device.type != "cuda":
        return
    from qcls.backends.registry import backend_for
    backend = backend_for(cfg)
    backend.preflight(cfg, backend.source(cfg), loaded.device)
