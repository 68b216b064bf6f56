"""The backend interface: turn a model source into modules the engine calls, and say what went where."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from qcls.backends import partial, sources
from qcls.config import QclsConfig
from qcls.errors import ConfigError, DeviceError
from qcls.heads.weights_fingerprint import num_layers


@dataclass
class LoadedModel:
    """What a backend hands the engine. `model` is a transformers CausalLM whose decoder modules are
    called by the engine; the LM head is reached only through `head_rows` / `full_head`."""
    model: torch.nn.Module
    tokenizer: object
    device: torch.device
    dtype: torch.dtype
    backend: str
    graph_capturable: bool = True
    # Start-up lines that also go into result metadata: `notes` warn (a slower path, a mismatch), `info` tells
    # what was built (the int8 calibration's summary) and is printed without a warning's label.
    notes: list[str] = field(default_factory=list)
    info: list[str] = field(default_factory=list)
    memory: dict[str, int] = field(default_factory=dict)  # bytes: weights_gpu, weights_cpu, …
    # Offloading backends gather the embedding rows themselves: fn(ids_cpu [N], out [N, H] on device).
    embed_fn: Callable[[torch.Tensor, torch.Tensor], None] | None = None

    @property
    def source_config(self):
        """The checkpoint's config: the whole model's, also when only its first layers were loaded."""
        cut = partial.truncation(self.model)
        return self.model.config if cut is None else cut.source_config

    @property
    def layers(self) -> int:
        """Decoder layers loaded (all of them unless the forward stops at a head's layer)."""
        return num_layers(self.model.config)

    @property
    def layers_total(self) -> int:
        return num_layers(self.source_config)

    def head_rows(self, tokens: list[int]) -> torch.Tensor:
        """[len(tokens), H] rows of the LM head, on the compute device."""
        w = self.model.get_output_embeddings().weight
        return w[torch.tensor(tokens, device=w.device)].detach().to(self.device, self.dtype)

    def full_head(self) -> torch.Tensor | None:
        """The whole [V, H] LM head on the device (for full-vocabulary normalisers), or None."""
        w = self.model.get_output_embeddings().weight
        return w.detach() if w.device.type == self.device.type else None


def resolve_device(cfg: QclsConfig) -> torch.device:
    want = cfg.backend.device
    if want == "cuda" and not torch.cuda.is_available():
        raise DeviceError("backend.device=cuda but no CUDA GPU is visible",
                          "use backend.device=cpu (or auto) to run on the CPU; `qcls check` estimates GPU "
                          "memory without a GPU")
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(want)


def resolve_dtype(cfg: QclsConfig, device: torch.device) -> torch.dtype:
    if cfg.backend.dtype == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    return {"float16": torch.float16, "float32": torch.float32}[cfg.backend.dtype]


def module_bytes(model: torch.nn.Module) -> dict[str, int]:
    """Bytes of parameters and buffers per device type."""
    out: dict[str, int] = {}
    seen = set()
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) in seen or t.device.type == "meta":  # meta: a dropped LM head's placeholder, no memory
            continue
        seen.add(id(t))
        key = "weights_gpu" if t.device.type == "cuda" else "weights_cpu"
        out[key] = out.get(key, 0) + t.numel() * t.element_size()
    return out


def backend_options(cfg: QclsConfig, defaults: dict[str, Any]) -> dict[str, Any]:
    """`backend.options` over `defaults`; an unknown key is an error naming the known ones (a typo must not
    silently fall back to a default)."""
    given = dict(cfg.backend.options)
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ConfigError(f"backend {cfg.backend.name}: unknown option(s) {unknown}",
                          f"known: {sorted(defaults) or 'none'} (backend.options.NAME=VALUE)")
    return {**defaults, **given}


class Backend:
    """Subclass, set `name`, implement `load`; register it with one line in registry.py."""
    name = "base"

    def load(self, cfg: QclsConfig, layers: int | None = None, tokenizer=None) -> LoadedModel:
        """`layers`: load only the first this many decoder layers and no untied LM head (the forward stops at a
        head's layer); None: the whole model. `tokenizer`: the source's tokenizer when the caller has read it
        already (a Classifier reads it first, to check the label sets); None: read here."""
        raise NotImplementedError

    def preflight(self, cfg: QclsConfig, src: sources.Source, device: torch.device, layers: int | None = None):
        """Estimate GPU memory from the model config alone and refuse before any weight is read when it
        will not fit (CUDA only). Returns the MemoryEstimate, or None on the CPU."""
        if device.type != "cuda":
            return None
        from qcls.backends import memory  # memory imports this module
        est = memory.estimate(cfg, sources.load_config(src), backend=self.name, layers=layers)
        memory.check_budget(cfg, est, device=device)
        return est

    @staticmethod
    def source(cfg: QclsConfig) -> sources.Source:
        return sources.resolve(cfg.model, cfg.cache_dir)
