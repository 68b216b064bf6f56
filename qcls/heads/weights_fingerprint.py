"""Fingerprints that tie a learned head to the model it was fitted on (which weights; the answers' fingerprint,
which configuration answered, is qcls/results/answer_fingerprint.py).

A head multiplies hidden states: on another model (or other weights of the same architecture) its numbers
are meaningless, and nothing at request time would say so. Two short hashes are stored in the head file:

- `config`: the architecture facts that fix the hidden state's meaning and size;
- `weights`: a sample of weights that no backend quantizes (four embedding rows and every norm weight),
  rounded to float16 first, so the same checkpoint gives the same hash in fp32 on a CPU and in fp16, int8
  or NF4 on a GPU, and reading it costs microseconds even for an 8B model.
"""
from __future__ import annotations

import hashlib

import torch

CONFIG_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "head_dim", "intermediate_size", "vocab_size", "tie_word_embeddings")


def text_config(config):
    """The decoder's own config (multimodal wrappers keep it under text_config)."""
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def config_facts(config) -> dict:
    cfg = text_config(config)
    return {k: getattr(cfg, k, None) for k in CONFIG_KEYS}


def config_fingerprint(config) -> str:
    facts = config_facts(config)
    return hashlib.sha256(repr(sorted(facts.items())).encode()).hexdigest()[:16]


@torch.inference_mode()
def weights_fingerprint(model) -> str:
    h = hashlib.sha256()
    emb = model.get_input_embeddings().weight
    v = emb.shape[0]
    for row in sorted({0, v // 3, 2 * v // 3, v - 1}):
        h.update(emb[row].detach().to("cpu", torch.float16).numpy().tobytes())
    norms = {name: mod.weight for name, mod in model.named_modules()
             if "norm" in type(mod).__name__.lower() and isinstance(getattr(mod, "weight", None), torch.Tensor)
             and mod.weight.dim() == 1}
    # a model loaded with its first layers only (qcls/backends/partial.py) keeps the later layers' norms aside,
    # so its fingerprint is the whole checkpoint's
    cut = getattr(model, "qcls_truncation", None)
    norms.update(cut.dropped_norms if cut is not None else {})
    for name in sorted(norms):
        h.update(name.encode())
        h.update(norms[name].detach().to("cpu", torch.float16).numpy().tobytes())
    return h.hexdigest()[:16]


def num_layers(config) -> int:
    return int(text_config(config).num_hidden_layers)


def hidden_size(config) -> int:
    return int(text_config(config).hidden_size)
