"""A lean decoder forward for the Llama / Qwen2 / Qwen3 families over a flat token sequence.

It calls the loaded transformers model's own modules (norms, q/k/v/o projections, Qwen3 q/k norms, MLP),
so quantized linear layers from any backend plug in unchanged. What it does differently from
transformers: tokens are one flat sequence with explicit positions, K/V go into a preallocated buffer
(prefix pool first, then this forward's tokens), attention takes an arbitrary mask, and only the rows
that are read come out.

GQA without repeating K/V: queries [N, heads, d] are viewed as [groups, kv_heads, N, d], and the K/V
buffer [kv_heads, S, d] is expanded over the group dimension with stride 0.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# The T4 envelope: no FlashAttention, no cuDNN attention (sm_80+ only).
T4_SDPA = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
SUPPORTED = ("llama", "qwen2", "qwen3")


class Decoder:
    def __init__(self, model, max_keys: int):
        cfg = model.config
        if cfg.model_type not in SUPPORTED:
            raise ValueError(f"model_type {cfg.model_type!r} is not supported by the engine; supported: {SUPPORTED}")
        if getattr(cfg, "use_sliding_window", False):
            raise ValueError("sliding-window attention is not supported; set use_sliding_window=false")
        base = model.model
        self.embed = base.embed_tokens
        self.layers = list(base.layers)
        self.norm = base.norm
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.groups = self.n_heads // self.n_kv
        # The final norm lives where the decoder computes (an offloading backend may keep the embedding
        # table on the CPU).
        self.device = self.norm.weight.device
        self.dtype = self.norm.weight.dtype
        self.max_positions = cfg.max_position_embeddings
        self.cos, self.sin = self._rope_table(base.rotary_emb, self.max_positions)
        shape = (len(self.layers), self.n_kv, max_keys, self.head_dim)
        self.k = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v = torch.zeros(shape, dtype=self.dtype, device=self.device)

    @torch.inference_mode()
    def _rope_table(self, rotary_emb, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for every position once, from the model's own rotary module (so every rope variant
        the config names — default, llama3, linear, yarn — is honoured)."""
        pos = torch.arange(n, device=self.device)[None]
        x = torch.zeros(1, dtype=self.dtype, device=self.device)
        cos, sin = rotary_emb(x, pos)
        return cos[0].to(self.dtype).contiguous(), sin[0].to(self.dtype).contiguous()

    @property
    def kv_bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin

    def forward(self, ids: torch.Tensor, pos: torch.Tensor, write: slice | torch.Tensor, key_len: int,
                mask: torch.Tensor, read: torch.Tensor, embeds: torch.Tensor | None = None) -> torch.Tensor:
        """ids/pos [N]; K/V of these tokens go to buffer slots `write`; attention over slots [0, key_len)
        with additive `mask` [N, key_len]; returns final-normed hidden states of tokens `read` [R, H].
        `embeds` [N, H], when given, replaces the embedding lookup (backends that keep the table off the
        device gather it themselves)."""
        n, nh, nkv, d, g = ids.shape[0], self.n_heads, self.n_kv, self.head_dim, self.groups
        h = self.embed(ids) if embeds is None else embeds
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]
        attn_mask = mask[None, None]
        for i, layer in enumerate(self.layers):
            a = layer.self_attn
            x = layer.input_layernorm(h)
            q = a.q_proj(x).view(n, nh, d)
            k = a.k_proj(x).view(n, nkv, d)
            v = a.v_proj(x).view(n, nkv, d)
            if hasattr(a, "q_norm"):
                q, k = a.q_norm(q), a.k_norm(k)
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            self.k[i][:, write] = k.transpose(0, 1)
            self.v[i][:, write] = v.transpose(0, 1)
            kk = self.k[i][None, :, :key_len].expand(g, nkv, key_len, d)
            vv = self.v[i][None, :, :key_len].expand(g, nkv, key_len, d)
            qq = q.view(n, nkv, g, d).permute(2, 1, 0, 3)
            with sdpa_kernel(T4_SDPA):
                o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=attn_mask)
            h = h + a.o_proj(o.permute(2, 1, 0, 3).reshape(n, nh * d))
            if i == len(self.layers) - 1:
                h = h[read]  # the last MLP and the final norm only for rows that are read
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.norm(h)
