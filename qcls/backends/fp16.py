"""fp16: every weight on the device (float16 on a GPU; float32 on the CPU unless dtype says otherwise)."""
from __future__ import annotations

from qcls.backends import sources
from qcls.backends.base import Backend, LoadedModel, module_bytes, resolve_device, resolve_dtype
from qcls.config import QclsConfig


class Fp16Backend(Backend):
    name = "fp16"

    def load(self, cfg: QclsConfig, layers: int | None = None, tokenizer=None) -> LoadedModel:
        device = resolve_device(cfg)
        dtype = resolve_dtype(cfg, device)
        src = self.source(cfg)
        est = self.preflight(cfg, src, device, layers)  # refuse before reading weights when it cannot fit
        tokenizer = sources.load_tokenizer(src) if tokenizer is None else tokenizer
        model = sources.load_model(src, dtype, layers).to(device)
        memory = module_bytes(model)
        if est is not None:
            memory.update(est.as_dict())
        return LoadedModel(model, tokenizer, device, dtype, self.name, memory=memory)
