"""The packed forward's static layout for one bucket (b queries, query slots Qb) — design.md §4.

All rows lie back to back in one flat token sequence after the prefix pool:

    pool (every prompt's prefix KV, shared blocks once) | row(q0,p0) | row(q0,p1) | … | row(qb-1,pP-1)
    row(q, p) = [query slots (left-padded to Qb) | suffix of p | trie tokens of p]

Left-padding the query keeps every suffix, trie token and read position at a fixed offset, so read
indices are static; only `qlen` moves positions and hides pad keys. Everything here is computed once at
start-up; the request path touches only `qids`/`qlen` (see engine.Bucket).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from qcls.engine.prefix_cache import PrefixPlan
from qcls.scoring.strategies import ScorePlan
from qcls.scoring.tokenization import PromptTokens
from qcls.scoring.trie import LabelTrie


@dataclass
class PromptLayout:
    """One prompt's row, independent of the batch: built once per query bucket."""
    tokens: PromptTokens
    trie: LabelTrie
    plan: ScorePlan
    row_nodes: list[int]  # trie nodes placed after the suffix, in order

    def row_len(self, qb: int) -> int:
        return qb + len(self.tokens.suffix_ids) + len(self.row_nodes)

    def read_offsets(self, qb: int) -> list[int]:
        """Row offset of the token whose output is each read node's hidden state."""
        seq_end = qb + len(self.tokens.suffix_ids) - 1  # last suffix token (or last query slot)
        where = {n: seq_end + 1 + i for i, n in enumerate(self.row_nodes)}
        return [seq_end if n == 0 else where[n] for n in self.plan.read_nodes]

    def row_mask(self, qb: int) -> torch.Tensor:
        """[T, T] bool: causal over query+suffix; a trie token sees the sequence and its own ancestors."""
        seq = qb + len(self.tokens.suffix_ids)
        t = self.row_len(qb)
        m = torch.zeros(t, t, dtype=torch.bool)
        m[:seq, :seq] = torch.ones(seq, seq, dtype=torch.bool).tril()
        m[seq:, :seq] = True
        at = {n: seq + i for i, n in enumerate(self.row_nodes)}
        for n in self.row_nodes:
            for a in self.trie.ancestors_or_self(n):
                m[at[n], at[a]] = True
        return m

    def pos_base(self, qb: int, prefix_len: int) -> list[int]:
        """Position minus qlen for every row token (pads come out negative and are clamped)."""
        s = len(self.tokens.suffix_ids)
        return ([prefix_len + i - qb for i in range(qb)] + [prefix_len + j for j in range(s)]
                + [prefix_len + s - 1 + self.trie.nodes[n].depth for n in self.row_nodes])


@dataclass
class BucketLayout:
    b: int
    qb: int
    n_tokens: int  # N: tokens in the packed rows
    key_len: int  # pool_len + N (+ padding to a multiple of 8 for aligned mask rows)
    ids_static: torch.Tensor  # [N] suffix and trie ids; query slots 0
    is_query: torch.Tensor  # [N] bool
    query_src: torch.Tensor  # [N] index into qids.view(-1) for query slots
    from_end: torch.Tensor  # [N] Qb - slot for query slots (valid iff from_end <= qlen)
    row_query: torch.Tensor  # [N] which query of the batch the token belongs to
    pos_base: torch.Tensor  # [N]
    static_mask: torch.Tensor  # [N, key_len] bool
    read_idx: torch.Tensor  # [R] flat token index of every read, query-major then prompt order
    read_counts: list[int]  # per prompt: reads per query


def build_bucket(prompts: list[PromptLayout], pool: PrefixPlan, pool_len: int, b: int, qb: int) -> BucketLayout:
    rows = [(q, p) for q in range(b) for p in range(len(prompts))]
    n = sum(prompts[p].row_len(qb) for _, p in rows)
    key_len = pool_len + n
    key_len += (-key_len) % 16  # mem-efficient SDPA wants mask rows aligned to 16
    ids, is_q, src, from_end, rq, pos, reads = [], [], [], [], [], [], []
    mask = torch.zeros(n, key_len, dtype=torch.bool)
    off = 0
    for q, p in rows:
        pl = prompts[p]
        t = pl.row_len(qb)
        ids += [0] * qb + list(pl.tokens.suffix_ids) + [pl.trie.nodes[x].token for x in pl.row_nodes]
        is_q += [True] * qb + [False] * (t - qb)
        src += [q * qb + i for i in range(qb)] + [0] * (t - qb)
        from_end += [qb - i for i in range(qb)] + [0] * (t - qb)
        rq += [q] * t
        prefix_len = len(pl.tokens.prefix_ids)
        pos += pl.pos_base(qb, prefix_len)
        reads += [off + r for r in pl.read_offsets(qb)]
        slots = torch.tensor(pool.prompt_slots(p), dtype=torch.long)
        if len(slots):
            mask[off:off + t, slots] = True
        mask[off:off + t, pool_len + off:pool_len + off + t] = pl.row_mask(qb)
        off += t
    L = torch.long
    return BucketLayout(b, qb, n, key_len, torch.tensor(ids, dtype=L), torch.tensor(is_q), torch.tensor(src, dtype=L),
                        torch.tensor(from_end, dtype=L), torch.tensor(rq, dtype=L), torch.tensor(pos, dtype=L), mask,
                        torch.tensor(reads, dtype=L), [len(pl.plan.read_nodes) for pl in prompts])
