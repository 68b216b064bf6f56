"""Attention over the packed sequence: which keys a token sees is docs/design.md §4's tree mask.

Two implementations of the same function (tests hold them equal); both are called per layer as
`attend(q, k, v, window=None, scale=None)`: `window` > 0 is a sliding window (a key is visible only if
pos(query) - pos(key) < window), `scale` the softmax scale (default head_dim ** -0.5).

- `DenseAttention`: SDPA (memory-efficient or math kernel: the T4 envelope) over every key slot with an
  additive [N, keys] mask. Every token scores the whole prefix pool and every token of the batch before
  the mask discards most of it: O(N · (pool + N)). The CPU path and the prefix fill at start-up use it.
- `TreeAttention`: Triton kernels (tree_kernels.py, row_kernel.py) that visit only the keys a token can see: its own
  prompt's prefix and its own row, with the causal/trie-ancestry test done on the fly from the per-token
  descriptors. O(N · (prefix + row)). Long prefixes are split into chunks read by many programs at once,
  each chunk once for all query tokens that see it (a shared system block once for all its prompts), and
  the partial softmax states are merged per tile with the row's own keys; tree_plan.py plans this per
  bucket at start-up. GQA without repeating K/V: a program serves all query heads of one KV head.

The kernels' dots are small (≤ 64 query vectors × ≤ 64 keys); on sm_75 Triton runs them without tensor
cores, which is fine at this size (the big GEMMs stay on cuBLAS).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from qcls.engine import row_kernel as R
from qcls.engine import tree_kernels as K
from qcls.engine.tree_plan import TreePlan, head_split

triton = K.triton

# The T4 envelope: no FlashAttention, no cuDNN attention (sm_80+ only).
# on the CPU too: PyTorch's fused C++ kernel there (SDPBackend.FLASH_ATTENTION) saved 2-3 ms of the demo's
# request, but int8's winners then agreed with float32's on 0.934 of the demo's test pairs against 0.970
# (float32's own winners unchanged; bench/RESULTS.md)
T4_SDPA = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
TILE = K.TILE  # tokens per row-kernel program (tile entries are written by layout.Packer)
LOG2E = 1.4426950408889634


def tree_available(device: torch.device, head_dim: int) -> str | None:
    """None if TreeAttention can run here, else why not."""
    if triton is None:
        return "Triton is not installed"
    if head_dim & (head_dim - 1) or head_dim < 16:
        return f"head_dim={head_dim} is not a power of two ≥ 16"
    if device.type != "cuda":
        return None if os.environ.get("TRITON_INTERPRET") == "1" else \
            "the tree-attention kernel needs a CUDA device (or TRITON_INTERPRET=1 for tests)"
    if torch.cuda.get_device_capability(device) < (7, 0):
        return f"Triton needs compute capability 7.0+, this GPU is {torch.cuda.get_device_capability(device)}"
    return None


@dataclass
class RawQKV:
    """What the q/k/v kernel would read (qkv_kernels.qkv_into), handed to TreeAttention instead so that its
    kernels do that work themselves (engine.fuse_qkv_attention): the QKV GEMM's q/k/v as [N, heads, d] views,
    the layer's cos/sin at each token's position [N, d] (gathered once per forward and rope kind: a row per
    token, so the kernels need not look up positions first), the q/k norm weights (None: no norm)."""
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    eps: float
    offset: bool  # Gemma3's norms: × (1 + w)

    def __post_init__(self) -> None:
        d = self.q.shape[-1]
        if any(x.stride(2) != 1 or x.stride(1) != d for x in (self.q, self.k, self.v)) or self.k.stride(0) != \
                self.v.stride(0) or not (self.cos.is_contiguous() and self.sin.is_contiguous()):
            raise ValueError("fused q/k/v needs each head's d values contiguous, k and v with one row stride, "
                             "and contiguous cos/sin tables")


class DenseAttention:
    """SDPA over buffer slots [0, key_len); `mask(window)` gives the [N, key_len] bool visibility, built once
    per window the layers ask for (layout.build_mask)."""

    def __init__(self, mask: Callable[[int], torch.Tensor], key_len: int):
        self.mask, self.key_len = mask, key_len
        self._additive: dict[int, torch.Tensor] = {}

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None = None,
                 scale: float | None = None) -> torch.Tensor:
        """q [N, heads, d]; k/v one layer's buffer [kv_heads, slots, d] → [N, heads·d]."""
        n, nh, d = q.shape
        nkv = k.shape[0]
        g = nh // nkv
        w = int(window or 0)
        if w not in self._additive:
            vis = self.mask(w)
            self._additive[w] = torch.zeros(vis.shape, dtype=q.dtype, device=q.device).masked_fill_(
                ~vis, float("-inf"))[None, None]
        kk = k[None, :, :self.key_len].expand(g, nkv, self.key_len, d)
        vv = v[None, :, :self.key_len].expand(g, nkv, self.key_len, d)
        qq = q.view(n, nkv, g, d).permute(2, 1, 0, 3)
        with sdpa_kernel(T4_SDPA):
            o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=self._additive[w], scale=scale)
        return o.permute(2, 1, 0, 3).reshape(n, nh * d)


class TreeAttention:
    """The tree-masked attention of one packed forward, visiting only visible keys (Triton).

    Its output and the partial states of the prefix chunks are allocated here, once per forward: inside a
    CUDA graph capture that is at start-up, and every layer reuses them (o_proj reads the output before
    the next layer writes it). `raw` (RawQKV): the kernels rotate q and k themselves, q in registers; this
    forward's K/V go to the KV buffer (at pool_len + token) only where the tuning keeps the row's keys out of
    the registers (Tuning.row_keys_in_registers); the query buffer is not used."""
    fuses_qkv = True

    def __init__(self, d: dict[str, torch.Tensor], plan: TreePlan, pool_len: int, heads: int, head_dim: int,
                 dtype: torch.dtype):
        self.d, self.plan, self.pool_len = d, plan, pool_len
        n, dev = d["ids"].shape[0], d["ids"].device
        self.out = torch.empty(n, heads * head_dim, dtype=dtype, device=dev)
        rows = n if plan.max_splits else 1  # no split prefix: a placeholder (never a null pointer), never read
        self.part = torch.empty(max(plan.max_splits, 1), rows, heads, head_dim, dtype=torch.float32, device=dev)
        self.ml = torch.empty(max(plan.max_splits, 1), rows, heads, 2, dtype=torch.float32, device=dev)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None = None,
                 scale: float | None = None, raw: RawQKV | None = None) -> torch.Tensor:
        n, nh, d = q.shape
        nkv = k.shape[0]
        g = nh // nkv
        gp = triton.next_power_of_2(g)
        scale = (d ** -0.5 if scale is None else scale) * LOG2E  # the kernels' scores are in log2 units
        window = int(window or 0)
        t, ds, plan = self.plan.tuning, self.d, self.plan
        split_stride = n * nh  # (token, head) rows per split of the partial states
        if raw is None:  # placeholders (never read): q for every pointer, 0 for the strides
            fused = dict(FUSED=False, HAS_NORM=False, OFFSET=False)
            qr = kr = vr = cos = sin = qw = kw = q
            qr_s0 = kr_s0 = 0
            eps = 0.0
        else:
            fused = dict(FUSED=True, HAS_NORM=raw.q_norm is not None, OFFSET=raw.offset)
            qr, kr, vr, cos, sin = raw.q, raw.k, raw.v, raw.cos, raw.sin
            qw = raw.q_norm if raw.q_norm is not None else q
            kw = raw.k_norm if raw.k_norm is not None else q
            qr_s0, kr_s0, eps = raw.q.stride(0), raw.k.stride(0), raw.eps
        if plan.work.shape[0]:
            K.prefix_kernel[(plan.work.shape[0], nkv)](
                q, k, v, ds["pos"], ds["qtok"], ds["qstart"], plan.work, self.part, self.ml, qr, cos, sin, qw,
                q.stride(0), q.stride(1), k.stride(0), split_stride, qr_s0, nh, scale, window, eps,
                G=g, GP=gp, D=d, BQ=t.bq, BN=t.bn, QB=t.qb, WINDOW=window > 0, UNMASKED=t.unmasked, **fused,
                num_warps=t.warps, num_stages=t.stages)
        hs = head_split(t, g)  # the row kernel's programs per KV head and tile
        R.row_kernel[(ds["tiles"].shape[0] // K.TILE_FIELDS, nkv * hs)](
            q, k, v, self.out, ds["seq"], ds["anc"], ds["tslot"], ds["pos"], ds["tiles"], plan.runs,
            plan.inline_runs, plan.n_splits, self.part, self.ml, qr, kr, vr, cos, sin, qw, kw, self.pool_len,
            plan.runs.stride(0), q.stride(0), q.stride(1), self.out.stride(0), k.stride(0), split_stride, qr_s0,
            kr_s0, kr_s0, nh, scale, window, eps,
            G=g // hs, GP=triton.next_power_of_2(g // hs), D=d, TILE=t.row_tile, BT=t.row_bt, BN=t.row_bn,
            WINDOW=window > 0, **fused, KEYS_REG=t.row_keys_in_registers, HS=hs,
            EARLY=t.row_early_loads, EARLY_Q=t.row_early_q, EARLY_KV=t.row_early_kv,
            VK=t.row_values_with_keys,
            num_warps=t.row_warps, num_stages=t.row_stages, **({"maxnreg": t.row_maxnreg} if t.row_maxnreg else {}))
        return self.out
