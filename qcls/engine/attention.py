"""Attention over the packed sequence: which keys a token sees is design.md §4's tree mask.

Two implementations of the same function (tests hold them equal):

- `DenseAttention`: SDPA (memory-efficient or math kernel: the T4 envelope) over every key slot with an
  additive [N, keys] mask. Every token scores the whole prefix pool and every token of the batch before
  the mask discards most of it: O(N · (pool + N)). The CPU path and the prefix fill at start-up use it.
  A layer's sliding window (Gemma3's local layers) further hides keys with pos(query) - pos(key) ≥ window,
  from the positions of queries and key slots.
- `TreeAttention`: a Triton kernel that visits only the keys a token can see: its own prompt's prefix
  slots (through a per-prompt slot table, so shared blocks are read where they lie) and its own row, with
  the causal/trie-ancestry test done on the fly from the per-token descriptors. O(N · (prefix + row)).
  One program handles a tile of ≤ TILE tokens of one row for one KV head and all query heads of its
  group (GQA without repeating K/V); the tile table is written by the Packer per request.

The kernel's dots are small (≤ 64 query vectors × ≤ 64 keys); on sm_75 Triton runs them without tensor
cores, which is fine at this size (the big GEMMs stay on cuBLAS).
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs
    triton = None

# The T4 envelope: no FlashAttention, no cuDNN attention (sm_80+ only).
T4_SDPA = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
TILE = 16  # tokens per program (tile entries are written by layout.Packer)
TILE_FIELDS = 5  # token start, token count, row start, row length, prompt
KEY_BLOCK, NUM_WARPS = 32, 4  # chosen with bench/attention.py


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


class DenseAttention:
    """SDPA over buffer slots [0, key_len) with an additive mask [N, key_len]."""

    def __init__(self, mask: torch.Tensor, key_len: int, q_pos: torch.Tensor | None = None,
                 k_pos: torch.Tensor | None = None):
        """q_pos [N] / k_pos [key_len]: positions of the queries and of every key slot, needed only by layers
        with a sliding window; their masks are built once per window per forward, at first use."""
        self.key_len, self.q_pos, self.k_pos = key_len, q_pos, k_pos
        self.masks: dict[int | None, torch.Tensor] = {None: mask[None, None]}

    def mask(self, window: int | None) -> torch.Tensor:
        if window not in self.masks:
            if self.q_pos is None or self.k_pos is None:
                raise ValueError("a sliding-window layer needs the query and key positions")
            far = self.q_pos[:, None] - self.k_pos[None, :] >= window
            self.masks[window] = self.masks[None].masked_fill(far[None, None], float("-inf"))
        return self.masks[window]

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None = None,
                 scale: float | None = None) -> torch.Tensor:
        """q [N, heads, d]; k/v one layer's buffer [kv_heads, slots, d] → [N, heads·d]. `window`: the layer's
        sliding window (None: global); `scale`: the softmax scale (None: d^-1/2)."""
        n, nh, d = q.shape
        nkv = k.shape[0]
        g = nh // nkv
        kk = k[None, :, :self.key_len].expand(g, nkv, self.key_len, d)
        vv = v[None, :, :self.key_len].expand(g, nkv, self.key_len, d)
        qq = q.view(n, nkv, g, d).permute(2, 1, 0, 3)
        with sdpa_kernel(T4_SDPA):
            o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=self.mask(window), scale=scale)
        return o.permute(2, 1, 0, 3).reshape(n, nh * d)


class TreeAttention:
    """The tree-masked attention of one packed forward, visiting only visible keys (Triton)."""

    # What the kernel takes per call besides the tree rule. A sliding window and a scale other than d^-1/2
    # (Gemma3) come with issue 18's kernel; until then the engine runs such layers on the dense path.
    supports_window = False
    supports_scale = False

    def __init__(self, seq: torch.Tensor, anc: torch.Tensor, tslot: torch.Tensor, tiles: torch.Tensor,
                 prefix_slots: torch.Tensor, prefix_len: torch.Tensor, pool_len: int, max_row: int,
                 out: torch.Tensor, key_block: int = KEY_BLOCK, num_warps: int = NUM_WARPS):
        """Loop bounds are compile-time constants (the longest prefix, `max_row` tokens in a row), rounded
        up to KEY_BLOCK so few kernel variants exist; blocks past a tile's own lengths are skipped."""
        self.seq, self.anc, self.tslot, self.tiles = seq, anc, tslot, tiles
        self.bn, self.warps = key_block, num_warps
        self.pmax = _round(prefix_slots.shape[1], key_block)
        self.rmax = _round(max_row, key_block)
        self.prefix_slots, self.prefix_len, self.pool_len = prefix_slots, prefix_len, pool_len
        self.out = out  # [N, heads·d], reused by every layer (o_proj reads it before the next layer writes)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None = None,
                 scale: float | None = None) -> torch.Tensor:
        if (window is not None and not self.supports_window) or (scale is not None and not self.supports_scale):
            raise ValueError(f"the tree-attention kernel has no sliding window / softmax scale yet "
                             f"(window={window}, scale={scale}): engine.attention=sdpa runs them")
        n, nh, d = q.shape
        nkv, slots = k.shape[0], k.shape[1]
        g = nh // nkv
        gp = triton.next_power_of_2(g)
        n_tiles = self.tiles.shape[0] // TILE_FIELDS
        _tree_attn_kernel[(n_tiles, nkv)](
            q, k, v, self.out, self.seq, self.anc, self.tslot, self.tiles, self.prefix_slots, self.prefix_len,
            self.pool_len, self.prefix_slots.shape[1], q.stride(0), q.stride(1), self.out.stride(0), slots * d, d ** -0.5,
            G=g, GP=gp, D=d, BT=TILE, BN=self.bn, PMAX=self.pmax, RMAX=self.rmax,
            num_warps=self.warps)
        return self.out


def _round(x: int, m: int) -> int:
    return max(m, -(-x // m) * m)


if triton is not None:
    @triton.jit
    def _online(sc, m_i, l_i, acc, v):
        """One online-softmax step (scores sc [M, BN] with -inf where hidden; v [BN, D])."""
        m_new = tl.maximum(m_i, tl.max(sc, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw nothing yet stay at 0
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(sc - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        return m_new, l_i, acc

    @triton.jit
    def _tree_attn_kernel(q_ptr, k_ptr, v_ptr, o_ptr, seq_ptr, anc_ptr, tslot_ptr, tiles_ptr, ptab_ptr,
                          plen_ptr, pool_len, ptab_stride, q_s0, q_s1, o_s0, kv_s_head, scale,
                          G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BT: tl.constexpr,
                          BN: tl.constexpr, PMAX: tl.constexpr, RMAX: tl.constexpr):
        tile = tl.program_id(0)
        h = tl.program_id(1)  # KV head; its query heads are h·G … h·G+G-1
        t0 = tl.load(tiles_ptr + tile * 5)
        cnt = tl.load(tiles_ptr + tile * 5 + 1)
        r0 = tl.load(tiles_ptr + tile * 5 + 2)
        used = (cnt > 0).to(tl.int64)  # unused tiles (count 0) loop over nothing
        rlen = tl.load(tiles_ptr + tile * 5 + 3) * used
        prompt = tl.load(tiles_ptr + tile * 5 + 4)
        plen = tl.load(plen_ptr + prompt) * used

        M: tl.constexpr = BT * GP
        mi = tl.arange(0, M)
        ti, gi = mi // GP, mi % GP  # query vector = (token of the tile, head of the group)
        tok = t0 + ti
        tok_ok = ti < cnt
        q_ok = tok_ok & (gi < G)
        dd = tl.arange(0, D)
        q = tl.load(q_ptr + tok[:, None] * q_s0 + (h * G + gi)[:, None] * q_s1 + dd[None, :],
                    mask=q_ok[:, None], other=0.0)
        seq_i = tl.load(seq_ptr + tok, mask=tok_ok, other=0)
        anc_i = tl.load(anc_ptr + tok, mask=tok_ok, other=0)

        m_i = tl.full([M], float("-inf"), tl.float32)
        l_i = tl.zeros([M], tl.float32)
        acc = tl.zeros([M, D], tl.float32)
        kh = k_ptr + h * kv_s_head
        vh = v_ptr + h * kv_s_head
        jn = tl.arange(0, BN)
        # 1. the prompt's cached prefix: every slot visible
        for s in range(0, PMAX, BN):
            if s < plen:
                j_ok = s + jn < plen
                slot = tl.load(ptab_ptr + prompt * ptab_stride + s + jn, mask=j_ok, other=0)
                kt = tl.load(kh + slot[None, :] * D + dd[:, None], mask=j_ok[None, :], other=0.0)
                sc = tl.where(j_ok[None, :], tl.dot(q, kt) * scale, float("-inf"))
                vt = tl.load(vh + slot[:, None] * D + dd[None, :], mask=j_ok[:, None], other=0.0)
                m_i, l_i, acc = _online(sc, m_i, l_i, acc, vt)
        # 2. the token's own row: sequence keys causally, trie keys if they are ancestors-or-self
        for s in range(0, RMAX, BN):
            if s < rlen:
                j_ok = s + jn < rlen
                key = r0 + s + jn
                seq_j = tl.load(seq_ptr + key, mask=j_ok, other=0)
                ts_j = tl.load(tslot_ptr + key, mask=j_ok, other=-1)
                causal = seq_j[None, :] <= seq_i[:, None]
                tree = ((anc_i[:, None] >> tl.maximum(ts_j, 0)[None, :]) & 1) != 0
                vis = tl.where(ts_j[None, :] < 0, causal, tree) & j_ok[None, :]
                slot = pool_len + key
                kt = tl.load(kh + slot[None, :] * D + dd[:, None], mask=j_ok[None, :], other=0.0)
                sc = tl.where(vis, tl.dot(q, kt) * scale, float("-inf"))
                vt = tl.load(vh + slot[:, None] * D + dd[None, :], mask=j_ok[:, None], other=0.0)
                m_i, l_i, acc = _online(sc, m_i, l_i, acc, vt)

        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(o_ptr + tok[:, None] * o_s0 + (h * G + gi)[:, None] * D + dd[None, :],
                 o.to(o_ptr.dtype.element_ty), mask=q_ok[:, None])
