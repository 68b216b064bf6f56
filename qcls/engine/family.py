"""What differs between the decoder families the engine runs, as data the one forward loop reads.

Llama / Qwen2 / Qwen3: pre-norm layers (input norm → attention → residual add → post-attention norm → SwiGLU
MLP → residual add), RMSNorm × w, one RoPE table, global attention, softmax scale head_dim^-1/2.
Gemma3 (model_type gemma3_text): "sandwich" layers with four norms (input, post-attention, pre-feedforward,
post-feedforward: the attention and MLP outputs are normed before their residual add), RMSNorm × (1 + w) in
fp32, q/k norms, GELU-tanh gated MLP, scale query_pre_attn_scalar^-1/2, and two kinds of layers: sliding
window ("local", RoPE base rope_local_base_freq) and global (RoPE base rope_theta with its scaling). Its
embedding module scales by √hidden (rounded to the table's dtype); the engine's first norm gathers the rows and
applies that factor itself, as the module rounds it (table_factor; a backend's gather applies the same scale:
qcls/backends/offload.py).

Everything the engine does not implement (attention or final logit soft-capping, bidirectional attention,
another activation) is refused here, by name, before any forward runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


@dataclass(frozen=True)
class LayerPlan:
    attn_in: nn.Module  # norm of the residual stream before attention
    attn_out: nn.Module | None  # norm of the attention output before its residual add (Gemma3)
    mlp_in: nn.Module  # norm of the residual stream before the MLP
    mlp_out: nn.Module | None  # norm of the MLP output before its residual add (Gemma3)
    rope: str  # key into Family.rotary
    window: int | None  # sliding window: a key is visible iff pos(query) - pos(key) < window; None = global


@dataclass(frozen=True)
class Family:
    name: str
    layers: list[LayerPlan]
    # rope key → fn(x, position_ids [1, n]) → (cos, sin) [1, n, d], the model's own rotary module(s)
    rotary: dict[str, Callable]
    norm_offset: bool  # RMSNorm weight applied as (1 + w) in fp32 (Gemma) rather than w × the rounded norm
    activation: str  # "silu" | "gelu_tanh": the gated MLP's activation
    scale: float | None  # attention softmax scale; None = head_dim^-1/2


LLAMA_LIKE = ("llama", "qwen2", "qwen3")
SUPPORTED = LLAMA_LIKE + ("gemma3_text",)


def describe(model) -> Family:
    """The family plan of a loaded transformers CausalLM; ValueError naming what is not supported."""
    cfg = model.config
    kind = cfg.model_type
    if kind not in SUPPORTED:
        raise ValueError(f"model_type {kind!r} is not supported by the engine; supported: {SUPPORTED}")
    return _gemma3(model) if kind == "gemma3_text" else _llama_like(model)


def _activation(name: str, kind: str) -> str:
    if name not in ACTIVATIONS:
        raise ValueError(f"{kind}: MLP activation {name!r} is not supported by the engine (supported: "
                         f"{sorted(ACTIVATIONS)})")
    return ACTIVATIONS[name]


def _llama_like(model) -> Family:
    cfg, base = model.config, model.model
    if getattr(cfg, "use_sliding_window", False):
        raise ValueError("sliding-window attention is not supported for this family; set use_sliding_window=false")
    layers = [LayerPlan(l.input_layernorm, None, l.post_attention_layernorm, None, "global", None)
              for l in base.layers]
    return Family(cfg.model_type, layers, {"global": base.rotary_emb}, False,
                  _activation(getattr(cfg, "hidden_act", "silu"), cfg.model_type), None)


def _gemma3(model) -> Family:
    cfg, base = model.config, model.model
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(cfg, key, None) is not None:
            raise ValueError(f"gemma3: {key}={getattr(cfg, key)} is not implemented by the engine (it reads raw "
                             "logits and plain softmax attention); use a config without soft-capping")
    if getattr(cfg, "use_bidirectional_attention", False):
        raise ValueError("gemma3: use_bidirectional_attention=true is not a causal decoder; the engine needs false")
    types = list(cfg.layer_types)
    unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
    if unknown:
        raise ValueError(f"gemma3: layer types {unknown} are not supported (sliding_attention, full_attention)")
    layers = [LayerPlan(l.input_layernorm, l.post_attention_layernorm, l.pre_feedforward_layernorm,
                        l.post_feedforward_layernorm, t, cfg.sliding_window if t == "sliding_attention" else None)
              for l, t in zip(base.layers, types)]
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    scale = float(cfg.query_pre_attn_scalar) ** -0.5
    return Family("gemma3_text", layers, {t: _gemma3_rotary(base, t) for t in set(types)}, True,
                  _activation(cfg.hidden_activation, "gemma3"), None if scale == d ** -0.5 else scale)


def _gemma3_rotary(base, layer_type: str) -> Callable:
    """transformers 5 has one rotary module taking the layer type; 4.x had a second module for local layers."""
    local = getattr(base, "rotary_emb_local", None)
    if local is not None:
        return local if layer_type == "sliding_attention" else base.rotary_emb
    return lambda x, pos: base.rotary_emb(x, pos, layer_type)


def embed_scale(embedding: nn.Module) -> torch.Tensor | None:
    """The factor an embedding module multiplies its rows by (Gemma3: √hidden as a buffer), or None."""
    return getattr(embedding, "embed_scale", None)


SCALED_TABLES = ("Gemma3TextScaledWordEmbedding",)  # nn.Embedding subclasses whose forward is rows × embed_scale


def table_factor(embedding: nn.Module) -> float | None:
    """The factor the embedding module multiplies the table's rows by where it is a plain lookup: 1.0 for
    nn.Embedding, Gemma3's √hidden rounded to the table's dtype (its forward multiplies by embed_scale.to(dtype),
    rounding the product to that dtype); None where the module does anything else (max_norm, another subclass)."""
    if not isinstance(embedding, nn.Embedding) or embedding.max_norm is not None:
        return None
    if type(embedding) is nn.Embedding:
        return 1.0
    if type(embedding).__name__ in SCALED_TABLES:
        return float(embed_scale(embedding).to(embedding.weight.dtype))
    return None
