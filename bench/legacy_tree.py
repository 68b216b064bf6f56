"""The tree-attention kernel as it was before issue 18 (commit 79f6800), kept only as the baseline that
bench/attention.py times the new kernels against in the same process: one program per tile of ≤ 16 tokens
of one row and KV head, walking all of that prompt's prefix keys serially (compile-time loop bounds).
Not used by qcls itself."""
from __future__ import annotations

import torch

from qcls.engine.attention import TILE, TILE_FIELDS

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs
    triton = None


def prefix_tables(packer, device) -> tuple[torch.Tensor, torch.Tensor]:
    """([P + 1, width] pool slot of every prefix token, [P + 1] prefix lengths) on `device`: the slot table this
    kernel walks (the engine's kernels walk runs of contiguous slots instead, tree_plan.prefix_runs)."""
    slots = [packer.pool.prompt_slots(p) for p in range(len(packer.prompts))]
    table = torch.zeros(len(slots) + 1, max([len(s) for s in slots] + [1]), dtype=torch.long)
    for p, s in enumerate(slots):
        table[p, :len(s)] = torch.tensor(s, dtype=torch.long)
    return table.to(device), packer.prefix_len.to(device)


def for_bucket(d: dict, packer, tables, pool_len: int, b: int, query_tokens: int,
               out: torch.Tensor) -> "LegacyTreeAttention":
    """The kernel for a bucket of b queries with query_tokens in all (its loop bounds: the longest row)."""
    max_row = max(min(query_tokens - (b - 1), 64) + max(x.const_len for x in packer.prompts), 16)
    return LegacyTreeAttention(d, *tables, pool_len, max_row, out)


class LegacyTreeAttention:
    def __init__(self, d: dict, prefix_slots: torch.Tensor, prefix_len: torch.Tensor, pool_len: int, max_row: int,
                 out: torch.Tensor, key_block: int = 32, num_warps: int = 4):
        self.seq, self.anc, self.tslot, self.tiles = d["seq"], d["anc"], d["tslot"], d["tiles"]
        self.bn, self.warps = key_block, num_warps
        self.pmax = _round(prefix_slots.shape[1], key_block)
        self.rmax = _round(max_row, key_block)
        self.prefix_slots, self.prefix_len, self.pool_len = prefix_slots, prefix_len, pool_len
        self.out = out

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window=None) -> torch.Tensor:
        n, nh, d = q.shape
        nkv, slots = k.shape[0], k.shape[1]
        g = nh // nkv
        _tree_attn_kernel[(self.tiles.shape[0] // TILE_FIELDS, nkv)](
            q, k, v, self.out, self.seq, self.anc, self.tslot, self.tiles, self.prefix_slots, self.prefix_len,
            self.pool_len, self.prefix_slots.shape[1], q.stride(0), q.stride(1), self.out.stride(0), slots * d,
            d ** -0.5, G=g, GP=triton.next_power_of_2(g), D=d, BT=TILE, BN=self.bn, PMAX=self.pmax, RMAX=self.rmax,
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
