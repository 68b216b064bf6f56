"""A lean decoder forward for the Llama / Qwen2 / Qwen3 / Gemma3 families over a flat token sequence.

It calls the loaded transformers model's own modules (norms, q/k/v/o projections, q/k norms, MLP), so
quantized linear layers from any backend plug in unchanged; what differs between families (which norms a
layer has, the norm and activation kinds, RoPE tables and sliding windows per layer, the attention scale)
is data from qcls/engine/family.py. What it does differently from transformers: tokens are one flat
sequence with explicit positions, K/V go into a preallocated buffer (prefix pool first, then this
forward's tokens), attention is a function given by the caller (dense masked SDPA or the tree kernel,
qcls/engine/attention.py) and called per layer with that layer's window and scale, and only the rows that
are read come out.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from qcls.engine.attention import RawQKV
from qcls.engine.family import SUPPORTED, describe, table_factor  # noqa: F401  (SUPPORTED: the engine's families)
from qcls.engine.int8_linear import Int8Linear, QuantizedRows
from qcls.engine.act_kernels import act_mul, gelu_tanh_mul, silu_mul
from qcls.engine.kernels import add_rmsnorm, gather_rows, post_add_rmsnorm
from qcls.engine.qkv_kernels import qkv_heads_per_program, qkv_into



class Decoder:
    def __init__(self, model, max_keys: int, reach: int | None = None, qkv_heads: int = 0,
                 fuse_post_norms: bool = True, fuse_qkv_attention: bool = True, stop_after: int | None = None):
        """`reach`: the highest position + 1 any token of this engine can have. A sliding window at least
        that wide hides nothing (pos(q) - pos(k) < reach ≤ window), so such a layer is global here; None keeps
        every window. `qkv_heads`: engine.qkv_heads_per_program; `fuse_post_norms`: engine.fuse_post_norms;
        `fuse_qkv_attention`: engine.fuse_qkv_attention (with an attention that takes RawQKV). `stop_after`: run
        only the first this many layers and end with the residual stream after them, handed to the taps (no
        final norm, no final state: the forward stops at a head's layer); None: every layer and the final norm."""
        cfg = model.config
        self.family = describe(model)
        base = model.model
        self.embed = base.embed_tokens
        n_loaded = len(base.layers)
        if stop_after is not None and not 1 <= stop_after <= n_loaded:
            raise ValueError(f"cannot stop after layer {stop_after}: {n_loaded} decoder layers are loaded")
        self.stop_after = stop_after
        self.layers = list(base.layers)[:stop_after]
        self.norm = base.norm
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.qkv_heads = qkv_heads_per_program(self.n_heads, self.n_kv, qkv_heads)
        self.fuse_post_norms = fuse_post_norms
        self.fuse_qkv_attention = fuse_qkv_attention
        # The final norm lives where the decoder computes (an offloading backend may keep the embedding
        # table on the CPU).
        self.device = self.norm.weight.device
        self.dtype = self.norm.weight.dtype
        # an embedding table beside the layers: the first norm gathers the tokens' rows itself, and scales them as
        # Gemma3's module does (one launch fewer, two for Gemma3); off-device tables and other modules run the module
        factor = table_factor(self.embed)
        self.embed_table = factor is not None and self.embed.weight.device == self.device
        self.embed_factor = None if factor == 1.0 else factor
        self.max_positions = cfg.max_position_embeddings
        # tables only as long as positions go here (Gemma3-4B: 131072 positions × 256 × 2 layer types)
        rows = self.max_positions if reach is None else min(reach, self.max_positions)
        # every RoPE kind's cos and sin as one [2·kinds, rows, d] table: a forward gathers its tokens' rows of all of
        # them in one launch (gather_rows)
        self.rope_kinds = list(self.family.rotary)
        self.rope = torch.stack([t for fn in self.family.rotary.values() for t in self._rope_table(fn, rows)])
        self.windows = [None if lp.window is None or (reach is not None and lp.window >= reach) else lp.window
                        for lp in self.family.layers]
        self.scale = self.family.scale
        self.gelu = self.family.activation == "gelu_tanh"
        shape = (len(self.layers), self.n_kv, max_keys, self.head_dim)
        self.k = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self._fuse()
        if any((getattr(l.self_attn, "q_norm", None) is None) != (getattr(l.self_attn, "k_norm", None) is None)
               for l in self.layers):
            raise ValueError("a layer has a q norm without a k norm (or the reverse): not a supported family")

    @torch.inference_mode()
    def _rope_table(self, rotary_emb, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for every position once, from the model's own rotary module (so every rope variant
        the config names — default, llama3, linear, yarn, Gemma3's per layer type — is honoured)."""
        pos = torch.arange(n, device=self.device)[None]
        x = torch.zeros(1, dtype=self.dtype, device=self.device)
        cos, sin = rotary_emb(x, pos)
        return cos[0].to(self.dtype).contiguous(), sin[0].to(self.dtype).contiguous()

    @property
    def kv_bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def _fuse(self) -> None:
        """Concatenate q/k/v and gate/up weights of plain nn.Linear layers (or of W8A8 Int8Linear ones) into one GEMM
        each. The original tensors become views into the fused one, so memory does not grow and the transformers
        model (the reference path) still works. Other quantized linear modules are left alone and called as
        modules."""
        self.qkv, self.gate_up = [], []
        for layer in self.layers:
            a, m = layer.self_attn, layer.mlp
            self.qkv.append(_fuse_linears([a.q_proj, a.k_proj, a.v_proj]))
            self.gate_up.append(_fuse_linears([m.gate_proj, m.up_proj]))

    @staticmethod
    def _eps(norm) -> float:
        return getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))

    def _norm(self, x: torch.Tensor, res: torch.Tensor | None, norm, out_dtype: torch.dtype | None = None,
              rows: torch.Tensor | None = None, scale: float | None = None, into=None):
        """(norm(x + res) in out_dtype (default the model's), x + res in float32) with the family's RMSNorm kind;
        `rows`: of these rows only (gathered inside the norm), `scale`: each gathered row × scale first. `into`: the
        linear that reads the output; a W8A8 one gets it quantized by the norm itself (QuantizedRows)."""
        int8 = _smoothing(into)
        y, s = add_rmsnorm(x, res, norm.weight, self._eps(norm), out_dtype or self.dtype, self.family.norm_offset,
                           rows, scale=scale, int8=int8)
        return (QuantizedRows(*y) if int8 is not None else y), s

    def _norm_after(self, delta: torch.Tensor, post, res: torch.Tensor | None, norm,
                    out_dtype: torch.dtype | None = None, rows: torch.Tensor | None = None, into=None):
        """`_norm(delta, res, norm)` where `post` is None, else Gemma3's post-norm of `delta` first (its float32
        output joins the residual unrounded): one fused launch with fuse_post_norms, else two. `rows`: the
        result has these rows of delta and res only; `into` as `_norm`'s."""
        if post is None:
            return self._norm(delta, res, norm, out_dtype, rows, into=into)
        if self.fuse_post_norms:
            int8 = _smoothing(into)
            y, s = post_add_rmsnorm(delta, res, post.weight, self._eps(post), norm.weight, self._eps(norm),
                                    out_dtype or self.dtype, self.family.norm_offset, rows=rows, int8=int8)
            return (QuantizedRows(*y) if int8 is not None else y), s
        delta, _ = self._norm(delta, None, post, torch.float32, rows)
        return self._norm(delta, res if rows is None else res[rows], norm, out_dtype, into=into)

    def forward(self, ids: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor, attend,
                read: torch.Tensor, embeds: torch.Tensor | None = None, taps=None) -> torch.Tensor | None:
        """ids/pos [N]; K/V of these tokens go to buffer `slots` [N]; `attend(q [N, heads, d], k, v, window=,
        scale=)` with one layer's K/V buffers, its sliding window (None: global) and softmax scale (None:
        d^-1/2) returns [N, heads·d]; returns final-normed hidden states of tokens `read` (None when the forward
        stops at a head's layer: `stop_after`). `embeds` [N, H], when given, replaces the embedding module's
        output (backends that keep the table off the device gather it, scaled as the module scales it). `taps`
        (engine/taps.py TapSink), when given, records the residual stream after the layers it names (the state a
        learned head reads)."""
        n, nh, nkv, d = ids.shape[0], self.n_heads, self.n_kv, self.head_dim
        table = embeds is None and self.embed_table
        delta = embeds if embeds is not None else self.embed.weight if table else self.embed(ids)
        res, post = None, None  # post: the norm the last MLP's output still needs (Gemma3), None elsewhere
        fused = self.fuse_qkv_attention and getattr(attend, "fuses_qkv", False)  # attention does the q/k/v work
        rows = gather_rows(self.rope, pos)  # [2·kinds, N, d]
        rope = {key: (rows[2 * i], rows[2 * i + 1]) for i, key in enumerate(self.rope_kinds)}
        q = torch.empty(n, nh, d, dtype=self.dtype, device=self.device)
        last = len(self.layers) - 1
        # the last layer's MLP runs for the rows that are read only: the final norm's rows, or, where the forward
        # stops at a head's layer and every head there reads the read position, those rows (`read` = the roots)
        narrow = self.stop_after is None or (taps is not None and taps.reads_position_only(self.stop_after))
        for i, (layer, lp) in enumerate(zip(self.layers, self.family.layers)):
            a = layer.self_attn
            if table and i == 0:  # the tokens' rows of the table, gathered (and scaled) by the first norm
                x, res = self._norm(delta, None, lp.attn_in, rows=ids, scale=self.embed_factor, into=self.qkv[i])
            else:
                x, res = self._norm_after(delta, post, res, lp.attn_in, into=self.qkv[i])
            if taps is not None and i in taps.layers:  # res = the residual stream after i layers
                taps.record(i, res)
            if self.qkv[i] is not None:
                qkv = _linear(self.qkv[i], x)
                qp, kp, vp = qkv.split([nh * d, nkv * d, nkv * d], -1)
            else:
                qp, kp, vp = a.q_proj(x), a.k_proj(x), a.v_proj(x)
            qn, kn = getattr(a, "q_norm", None), getattr(a, "k_norm", None)
            cos, sin = rope[lp.rope]
            qv, kv, vv = qp.view(n, nh, d), kp.view(n, nkv, d), vp.view(n, nkv, d)
            qw, kw = (qn.weight, kn.weight) if qn is not None else (None, None)
            eps = self._eps(qn) if qn is not None else 0.0
            if fused:  # K/V of this forward's tokens go to pool_len + token: `slots` as the engine makes them
                raw = RawQKV(qv, kv, vv, cos, sin, qw, kw, eps, self.family.norm_offset)
                att = attend(q, self.k[i], self.v[i], window=self.windows[i], scale=self.scale, raw=raw)
            else:
                qkv_into(qv, kv, vv, cos, sin, qw, kw, eps, q, self.k[i], self.v[i], slots,
                         offset=self.family.norm_offset, heads_per_program=self.qkv_heads)
                att = attend(q, self.k[i], self.v[i], window=self.windows[i], scale=self.scale)
            delta = _output(a.o_proj, att)
            rows = read if i == last and narrow else None  # gathered by the norm
            # Gemma3's norms after attention and MLP (attn_out, mlp_out) run with the next norm (_norm_after)
            x, res = self._norm_after(delta, lp.attn_out, res, lp.mlp_in, rows=rows, into=self.gate_up[i])
            if self.gate_up[i] is not None:
                down = layer.mlp.down_proj  # (module names looked up per call: benches swap them)
                int8 = _smoothing(down)
                if int8 is not None:  # the activation quantizes for down itself (reading gate/up's int32 product)
                    gu = _output(self.gate_up[i], x)
                    delta = _output(down, QuantizedRows(*(gelu_tanh_mul if self.gelu else silu_mul)(gu, int8=int8)))
                else:
                    gu = _linear(self.gate_up[i], x)
                    delta = down(gelu_tanh_mul(gu) if self.gelu else silu_mul(gu))
            else:  # gate and up as modules (quantized, streamed): the same float32 activation, one rounding
                m = layer.mlp
                delta = m.down_proj(act_mul(m.gate_proj(x), m.up_proj(x), self.gelu))
            post = lp.mlp_out
        if self.stop_after is not None:  # the residual stream after the last layer run is what the heads read
            if taps is not None:
                # the fused kernel adds the residual (and Gemma3's post-norm) as it would before a next layer;
                # the final norm's weights only fill its normed output, which nothing reads
                _, res = self._norm_after(delta, post, res, self.norm)
                taps.record(self.stop_after, res, rows_read=narrow)
            return None
        # the read rows' final states stay float32: the tail multiplies them by float32 label rows
        out, _ = self._norm_after(delta, post, res, self.norm, torch.float32)
        return out


def _smoothing(lin) -> torch.Tensor | bool | None:
    """For a W8A8 linear, what its input's quantization multiplies by first (its smoothing vector, or True: none);
    None for any other linear (its input stays floating point)."""
    if not isinstance(lin, Int8Linear):
        return None
    return lin.smooth if lin.smooth is not None else True


def _output(lin, x):
    """lin(x) (a module, or a fused plain (weight, bias)), or for a W8A8 linear without a bias its int32 product
    before the scales (Int32Product): the kernel that reads it next (a norm, the gated activation) applies them as
    it loads, and takes a float output as well."""
    if isinstance(lin, Int8Linear) and lin.bias is None:
        return lin.product(x)
    return _linear(lin, x)


def _linear(fused, x):
    """One fused GEMM: a joined Int8Linear module, or a plain (weight, bias)."""
    return fused(x) if isinstance(fused, nn.Module) else F.linear(x, *fused)


def _fuse_int8(mods: list[nn.Module]) -> Int8Linear | None:
    """One Int8Linear equal to the given ones side by side (their tensors become views of its), or None when they
    cannot share one input quantization."""
    if not Int8Linear.joinable(mods):
        return None
    first = mods[0]
    bias = _joined(mods, "bias") if first.bias is not None else None
    return Int8Linear(_joined(mods, "qweight"), _joined(mods, "wscale"), bias, first.smooth, first.out_dtype)


def _joined(mods: list[nn.Module], name: str) -> torch.Tensor:
    """The modules' buffer `name` stacked along dim 0, each module's becoming a view of it (shared if they already
    lie side by side)."""
    parts = [getattr(m, name) for m in mods]
    t = _side_by_side(parts)
    if t is not None:
        return t
    t = torch.cat(parts)
    off = 0
    for m, p in zip(mods, parts):
        setattr(m, name, t[off:off + p.shape[0]])
        off += p.shape[0]
    return t


def _fuse_linears(mods: list[nn.Module]):
    """(weight, bias) of one GEMM equal to the given plain linears side by side, or one Int8Linear for W8A8 ones;
    None if any is another module (a quantized one) or they differ in dtype/device/bias."""
    if all(isinstance(m, Int8Linear) for m in mods):
        return _fuse_int8(mods)
    if any(type(m) is not nn.Linear for m in mods):
        return None
    weights = [m.weight.detach() for m in mods]
    if len({(w.dtype, w.device) for w in weights}) != 1 or len({m.bias is None for m in mods}) != 1:
        return None
    biases = [m.bias.detach() for m in mods] if mods[0].bias is not None else None
    # an engine built earlier on these weights (the serving one, during a reload's build) joined them already:
    # share its tensor, or every build would hold a second copy of most of the weights until the swap
    w = _side_by_side(weights)
    b = _side_by_side(biases) if biases is not None else None
    if w is not None and (biases is None or b is not None):
        return w, b
    with torch.no_grad():
        w = torch.cat(weights)
        b = torch.cat(biases) if biases is not None else None
        off = 0
        for m in mods:
            rows = m.weight.shape[0]
            m.weight.data = w[off:off + rows]
            if b is not None:
                m.bias.data = b[off:off + rows]
            off += rows
    return w, b


def _side_by_side(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """The tensor `parts` already form when they lie one after another in one storage, as the views that
    _fuse_linears leaves do (a view of that storage, no copy); None when they do not."""
    first = parts[0]
    if any(p.shape[1:] != first.shape[1:] or not p.is_contiguous() for p in parts):
        return None
    ptr, at = first.untyped_storage().data_ptr(), first.storage_offset()
    for p in parts:
        if p.untyped_storage().data_ptr() != ptr or p.storage_offset() != at:
            return None
        at += p.numel()
    rows = sum(p.shape[0] for p in parts)
    return first.as_strided((rows, *first.shape[1:]), first.stride())
