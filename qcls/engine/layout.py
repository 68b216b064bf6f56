"""Packing a batch into one flat forward (design.md §4), with no padding inside rows.

All rows lie back to back after the prefix pool, each exactly as long as it needs:

    pool (every prompt's prefix KV, shared blocks once) | row(q0,p0) | row(q0,p1) | … | pad
    row(q, p) = [query ids | suffix of p | trie tokens of p]

A batch of b queries with L query tokens in all needs N = P·L + b·C tokens (C = Σ suffix + trie tokens
over the P prompts), so a CUDA graph is captured per (b, L-bucket) and only the tail of the sequence is
padded. Per request the host writes one int64 buffer of per-token descriptors (id, position, row, index
in the row's sequence, trie ancestry bits, trie slot, prompt) and the read indices; the mask is built
from them on the device inside the graph:

    key in the pool      → visible iff it belongs to the token's prompt's prefix
    key in the same row  → a sequence key: visible iff not after the token (trie tokens see all of them);
                           a trie key: visible iff it is an ancestor-or-self of the token
    anything else        → hidden (pads see only themselves)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from qcls.engine.prefix_cache import PrefixPlan
from qcls.scoring.strategies import ScorePlan
from qcls.scoring.tokenization import PromptTokens
from qcls.scoring.trie import LabelTrie

FIELDS = ("ids", "pos", "row", "seq", "anc", "tslot", "prompt")
TRIE_SEQ = 1 << 30  # a trie token's "sequence index": after every sequence token of its row
MAX_TRIE_TOKENS = 62  # ancestry is an int64 bitmask over a row's trie slots


@dataclass
class PromptLayout:
    """One prompt's row template: everything about the row that does not depend on the query."""
    tokens: PromptTokens
    trie: LabelTrie
    plan: ScorePlan
    row_nodes: list[int]  # trie nodes placed after the suffix, in order
    trie_ids: list[int] = field(init=False)
    trie_depth: list[int] = field(init=False)
    trie_anc: list[int] = field(init=False)  # per trie slot: bitmask of ancestor-or-self slots
    read_slots: list[int] = field(init=False)  # per read node: -1 = root (last sequence token), else trie slot

    def __post_init__(self) -> None:
        if len(self.row_nodes) > MAX_TRIE_TOKENS:
            raise ValueError(f"prompt '{self.tokens.name}' needs {len(self.row_nodes)} trie tokens in its row, "
                             f"over the limit of {MAX_TRIE_TOKENS}: use fewer or shorter labels, or scoring=trie")
        slot = {n: i for i, n in enumerate(self.row_nodes)}
        self.trie_ids = [self.trie.nodes[n].token for n in self.row_nodes]
        self.trie_depth = [self.trie.nodes[n].depth for n in self.row_nodes]
        self.trie_anc = [sum(1 << slot[a] for a in self.trie.ancestors_or_self(n)) for n in self.row_nodes]
        self.read_slots = [-1 if n == 0 else slot[n] for n in self.plan.read_nodes]

    @property
    def const_len(self) -> int:
        """Row tokens besides the query."""
        return len(self.tokens.suffix_ids) + len(self.row_nodes)


class Packer:
    """Turns a batch of query ids into the descriptor buffer of one forward."""

    def __init__(self, prompts: list[PromptLayout], pool: PrefixPlan, pool_len: int):
        self.prompts = prompts
        self.pool_len = pool_len
        # Which pool slots each prompt sees; the extra last row (seen by pads) sees none.
        self.visible = torch.zeros(len(prompts) + 1, pool_len, dtype=torch.bool)
        for p in range(len(prompts)):
            slots = pool.prompt_slots(p)
            if slots:
                self.visible[p, torch.tensor(slots)] = True
        self.const = sum(p.const_len for p in prompts)
        self.reads_per_query = sum(len(p.read_slots) for p in prompts)

    def n_tokens(self, b: int, query_tokens: int) -> int:
        return len(self.prompts) * query_tokens + b * self.const

    def buffer_len(self, b: int, n: int) -> int:
        return len(FIELDS) * n + b * self.reads_per_query

    def pack(self, batch: list[list[int]], n: int, out: torch.Tensor) -> None:
        """Write descriptors for `batch` into `out` (int64, buffer_len): FIELDS × n, then read indices."""
        cols: dict[str, list[int]] = {f: [] for f in FIELDS}
        reads: list[int] = []
        row = 0
        for q in batch:
            lq = len(q)
            for p, pl in enumerate(self.prompts):
                start = len(cols["ids"])
                lp, suf = len(pl.tokens.prefix_ids), pl.tokens.suffix_ids
                seq_len = lq + len(suf)
                cols["ids"] += q + list(suf) + pl.trie_ids
                cols["pos"] += list(range(lp, lp + seq_len)) + [lp + seq_len - 1 + d for d in pl.trie_depth]
                cols["row"] += [row] * (seq_len + len(pl.trie_ids))
                cols["seq"] += list(range(seq_len)) + [TRIE_SEQ] * len(pl.trie_ids)
                cols["anc"] += [0] * seq_len + pl.trie_anc
                cols["tslot"] += [-1] * seq_len + list(range(len(pl.trie_ids)))
                cols["prompt"] += [p] * (seq_len + len(pl.trie_ids))
                reads += [start + seq_len - 1 if s < 0 else start + seq_len + s for s in pl.read_slots]
                row += 1
        used = len(cols["ids"])
        if used > n:
            raise ValueError(f"batch needs {used} tokens, bucket holds {n}")
        pad = n - used
        cols["ids"] += [0] * pad
        cols["pos"] += [0] * pad
        cols["row"] += [-1 - i for i in range(pad)]  # unique: a pad shares a row with nothing
        cols["seq"] += [0] * pad
        cols["anc"] += [0] * pad
        cols["tslot"] += [-1] * pad
        cols["prompt"] += [len(self.prompts)] * pad
        flat = [v for f in FIELDS for v in cols[f]] + reads
        out[:len(flat)] = torch.tensor(flat, dtype=torch.long)


def unpack(buf: torch.Tensor, n: int) -> dict[str, torch.Tensor]:
    """Views of the descriptor buffer (host or device)."""
    views = {f: buf[i * n:(i + 1) * n] for i, f in enumerate(FIELDS)}
    views["read"] = buf[len(FIELDS) * n:]
    return views


def build_mask(d: dict[str, torch.Tensor], visible: torch.Tensor, key_len: int) -> torch.Tensor:
    """[N, key_len] bool attention mask from the descriptors (see the module docstring)."""
    n = d["ids"].shape[0]
    same_row = d["row"][:, None] == d["row"][None, :]
    seq_ok = d["seq"][None, :] <= d["seq"][:, None]
    tree_ok = ((d["anc"][:, None] >> d["tslot"].clamp_min(0)[None, :]) & 1).bool()
    own = same_row & torch.where((d["tslot"] < 0)[None, :], seq_ok, tree_ok)
    pool = visible[d["prompt"]]
    tail = own.new_zeros(n, key_len - pool.shape[1] - n)
    return torch.cat([pool, own, tail], 1)
