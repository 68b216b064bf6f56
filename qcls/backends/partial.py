"""Loading only the first L decoder layers of a checkpoint (docs/design.md §11): what a forward that stops at a
head's layer reads.

transformers builds the model from a config whose layer count is L, so the checkpoint's later layers are never
materialised (they are the loader's "unexpected keys"), and the LM head, which such a forward never multiplies,
is replaced by a weightless placeholder when it is not the embedding table. What the full model would have had
and the truncated one lacks, but a head's checks still need, is kept beside it in a `Truncation`: the source
config (the head's architecture check) and the norm weights of the dropped layers (the head's weights
fingerprint hashes every norm; they are a few KB, read from the checkpoint's safetensors files).
"""
from __future__ import annotations

import contextlib
import copy
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qcls.heads.weights_fingerprint import num_layers, text_config
from qcls.progress import warn


@dataclass
class Truncation:
    """What a model loaded with `layers` of `total` decoder layers left behind (attached to the model)."""
    layers: int
    total: int
    source_config: Any
    dropped_norms: dict[str, torch.Tensor] = field(default_factory=dict)  # module name → weight, layers ≥ L
    head_dropped: bool = False


ATTR = "qcls_truncation"  # the attribute of the transformers model that holds its Truncation


def truncation(model) -> Truncation | None:
    return getattr(model, ATTR, None)


def truncated_config(config, layers: int):
    """A copy of `config` with only the first `layers` decoder layers (and their layer types)."""
    cfg = copy.deepcopy(config)
    t = text_config(cfg)
    t.num_hidden_layers = layers
    if getattr(t, "layer_types", None) is not None:
        t.layer_types = list(t.layer_types)[:layers]
    return cfg


def plan_layers(config, layers: int | None) -> int | None:
    """`layers` if it cuts the model short, None for the whole depth; a layer count outside 1…N is a bug."""
    if layers is None:
        return None
    total = num_layers(config)
    if not 1 <= layers <= total:
        raise ValueError(f"cannot load {layers} decoder layers of a model with {total}")
    return None if layers == total else layers


@contextlib.contextmanager
def quiet_loader():
    """transformers' load report at error level only, for the duration of a truncated load."""
    from transformers.utils import logging
    before = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(before)


def check_loading_info(info: dict, layers: int) -> None:
    """A truncated load may leave out the layers after `layers` (and nothing else); say what else it left out."""
    later = re.compile(r"(^|\.)layers\.(\d+)\.")
    odd = [k for k in info.get("unexpected_keys", []) if not ((m := later.search(k)) and int(m.group(2)) >= layers)]
    missing = [k for k in info.get("missing_keys", []) if "lm_head" not in k]
    if odd or missing:
        warn(f"loading the first {layers} layers: unexpected keys {sorted(odd)[:8]}, missing keys "
             f"{sorted(missing)[:8]}")


def finish(model, source_config, layers: int, read_tensors) -> None:
    """After a truncated load: drop an untied LM head and keep what the head checks need (`read_tensors(names)` →
    {name: tensor} from the checkpoint, or None when it cannot read them)."""
    total = num_layers(source_config)
    norms = _dropped_norm_names(model, layers, total)
    got = read_tensors([n + ".weight" for n in norms]) if norms else {}
    dropped = {} if got is None else {n: got[n + ".weight"] for n in norms if n + ".weight" in got}
    if norms and len(dropped) != len(norms):
        warn(f"the norms of decoder layers {layers + 1}…{total} could not be read from the checkpoint: a head "
             "file's weights check will not match this partial load")
    setattr(model, ATTR, Truncation(layers, total, source_config, dropped, _drop_untied_head(model)))


def cut(model, source_config, layers: int) -> None:
    """Truncate a model loaded whole (in CPU memory) to its first `layers` decoder layers, as a truncated load."""
    state = dict(model.named_modules())
    norms = {n: state[n].weight.detach().clone() for n in _dropped_norm_names(model, layers, num_layers(source_config))}
    base = model.model
    base.layers = base.layers[:layers]
    t = text_config(model.config)
    t.num_hidden_layers = layers
    if getattr(t, "layer_types", None) is not None:
        t.layer_types = list(t.layer_types)[:layers]
    finish(model, source_config, layers, lambda names: {n + ".weight": norms[n] for n in norms})


def _drop_untied_head(model) -> bool:
    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or head.weight is emb.weight:
        return False
    model.set_output_embeddings(DroppedHead(*head.weight.shape))
    return True


class DroppedHead(nn.Module):
    """Where an untied LM head was: no weight, and a clear error for whoever calls it."""
    weight = None

    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.out_features, self.in_features = vocab, hidden

    def forward(self, x):
        raise RuntimeError("this model was loaded without its LM head (the forward stops at a head's layer): "
                           "run with engine.layer_exit=false for label scores")


def _dropped_norm_names(model, layers: int, total: int) -> list[str]:
    """Module names of the norms the full model has in layers L…N-1, after layer 0's (every layer is alike)."""
    first = [n for n, m in model.named_modules()
             if re.search(r"\.layers\.0\.", n + ".") and "norm" in type(m).__name__.lower()
             and isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 1]
    return [re.sub(r"\.layers\.0\.", f".layers.{i}.", n + ".", count=1)[:-1] for i in range(layers, total)
            for n in first]


def safetensors_reader(path: str):
    """`read(names)` over a checkpoint directory's safetensors files (one file or an index), None if it has none."""
    root = Path(path)

    def read(names: list[str]) -> dict[str, torch.Tensor] | None:
        from safetensors import safe_open
        index = root / "model.safetensors.index.json"
        if index.is_file():
            where = json.loads(index.read_text())["weight_map"]
        elif (root / "model.safetensors").is_file():
            where = {n: "model.safetensors" for n in names}
        else:
            return None
        out: dict[str, torch.Tensor] = {}
        by_file: dict[str, list[str]] = {}
        for n in names:
            if n in where:
                by_file.setdefault(where[n], []).append(n)
        for fname, ns in by_file.items():
            with safe_open(str(root / fname), framework="pt") as f:
                keys = set(f.keys())
                out.update({n: f.get_tensor(n) for n in ns if n in keys})
        return out

    return read
