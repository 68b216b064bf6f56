"""Packing a batch into one flat forward (docs/design.md §4), with no padding inside rows.

All rows lie back to back after the prefix pool, each exactly as long as it needs:

    pool (every prompt's prefix KV, shared blocks once) | row(q0,p0) | row(q0,p1) | … | pad
    row(q, p) = [query ids | suffix of p | trie tokens of p]

A batch of b queries with L query tokens in all needs N = P·L + b·C tokens (C = Σ suffix + trie tokens
over the P prompts), so a CUDA graph is captured per (b, L-bucket) and only the tail of the sequence is
padded. Per request the host writes one int64 buffer of per-token descriptors (id, position, row, index
in the row's sequence, trie ancestry bits, trie slot, prompt, and the row again for query tokens, -1 for the
others: what a head's query mean averages), the tokens of every row listed prompt by prompt in the prefix
order of PrefixPlan.prompt_order (`qtok`, with each prompt's start in `qstart`: the query blocks of the tree
kernel's prefix chunks), the read indices and the attention tiles (≤ a tile of tokens of one row: where the row
starts, how long it is, which prompt's prefix it sees). Which keys a token sees:

    key in the pool      → visible iff it belongs to the token's prompt's prefix
    key in the same row  → a sequence key: visible iff not after the token (trie tokens see all of them);
                           a trie key: visible iff it is an ancestor-or-self of the token
    anything else        → hidden (pads see only pads)
    and, in a layer with a sliding window w > 0, only keys with pos(token) - pos(key) < w, where a pool
    slot's position is its index in its prompt's prefix (the same for every prompt sharing the slot)

The tree-attention kernels apply this rule per tile (qcls/engine/attention.py); `build_mask` writes it out
as the dense [N, keys] mask of the SDPA path.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from qcls.config import PromptSpec
from qcls.engine.prefix_cache import PrefixPlan
from qcls.engine.tree_kernels import TILE_FIELDS, TILES
from qcls.errors import LabelSetError
from qcls.scoring.strategies import ScorePlan, unscored
from qcls.scoring.tokenization import PromptTokens, check_first_tokens, encode_prompt
from qcls.scoring.trie import LabelTrie

FIELDS = ("ids", "pos", "row", "seq", "anc", "tslot", "prompt", "qrow")
QROW = FIELDS.index("qrow")
TRIE_SEQ = 1 << 30  # a trie token's "sequence index": after every sequence token of its row
MAX_TRIE_TOKENS = 62  # ancestry is an int64 bitmask over a row's trie slots
LAYOUTS_KEPT = 256  # layouts of batches of several queries kept (each ~10 × tokens int64: 256 × ≤ 50 KB)


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
    label_token_counts: list[int] = field(init=False)  # per label: tokens of label_prefix + label (results)

    @classmethod
    def from_spec(cls, tokenizer, spec: PromptSpec, strategy, scored: bool = True) -> "PromptLayout":
        """Encode a prompt, build its label trie and `strategy`'s plan; a label set the strategy cannot
        score is a LabelSetError naming the prompt. `scored=False`: the labels are checked as `strategy` would
        score them, but the row reads only its root and holds no trie token (a head answers: no label scores)."""
        pt = encode_prompt(tokenizer, spec)
        if strategy.name == "first_token":
            check_first_tokens(tokenizer, pt)
        try:
            trie = LabelTrie.build(pt.label_ids, pt.end_id)
        except LabelSetError as e:
            raise LabelSetError(f"prompt '{spec.name}': {e.what}", e.way_out) from None
        plan = strategy.plan(trie)  # built either way: a label set the strategy refuses is refused alike
        plan = plan if scored else unscored(trie)
        return cls(pt, trie, plan, trie.row_nodes(plan.read_nodes))

    def __post_init__(self) -> None:
        if len(self.row_nodes) > MAX_TRIE_TOKENS:
            raise LabelSetError(f"prompt '{self.tokens.name}' needs {len(self.row_nodes)} trie tokens in its row, "
                             f"over the limit of {MAX_TRIE_TOKENS}: use fewer or shorter labels, or scoring=trie")
        slot = {n: i for i, n in enumerate(self.row_nodes)}
        self.trie_ids = [self.trie.nodes[n].token for n in self.row_nodes]
        self.trie_depth = [self.trie.nodes[n].depth for n in self.row_nodes]
        self.trie_anc = [sum(1 << slot[a] for a in self.trie.ancestors_or_self(n)) for n in self.row_nodes]
        self.read_slots = [-1 if n == 0 else slot[n] for n in self.plan.read_nodes]
        self.label_token_counts = [len(ids) for ids in self.tokens.label_ids]

    @property
    def const_len(self) -> int:
        """Row tokens besides the query."""
        return len(self.tokens.suffix_ids) + len(self.row_nodes)


class Packer:
    """Turns a batch of query ids into the descriptor buffer of one forward.

    Everything in a row but the query ids depends only on (prompt, query length), so the descriptors of
    all P rows of one query are built at start-up for every query length (numpy) and each request only
    fills in the ids and shifts row/token offsets."""

    def __init__(self, prompts: list[PromptLayout], pool: PrefixPlan, pool_len: int, max_query: int = 64,
                 tiles: tuple[int, ...] = TILES):
        """`tiles`: the sizes (tokens) of attention tiles a batch can be packed in, the first the default (a bucket's
        tree plan picks one: Tuning.row_tile, the row kernel's programs)."""
        self.prompts, self.tiles = prompts, tuple(tiles)
        self.pool, self.pool_len = pool, pool_len
        # Which pool slots each prompt sees; the extra last row (seen by pads) sees none.
        self.visible = torch.zeros(len(prompts) + 1, pool_len, dtype=torch.bool)
        self.prefix_len = torch.zeros(len(prompts) + 1, dtype=torch.long)
        self.slot_pos = torch.zeros(pool_len, dtype=torch.long)  # a pool slot's position in its prefix
        for p in range(len(prompts)):
            slots = pool.prompt_slots(p)
            if slots:
                self.visible[p, torch.tensor(slots)] = True
                self.prefix_len[p] = len(slots)
                self.slot_pos[torch.tensor(slots)] = torch.arange(len(slots))
        self.order = pool.prompt_order()
        self.const = sum(p.const_len for p in prompts)
        self.reads_per_query = sum(len(p.read_slots) for p in prompts)
        # every query length, at start-up: nothing is built on a first request
        self._templates = {lq: _QueryTemplate.build(prompts, lq, self.tiles) for lq in range(1, max_query + 1)}
        self._permanent: dict[tuple[int, ...], tuple[np.ndarray, list[np.ndarray]]] = {}
        self._recent: dict[tuple[int, ...], tuple[np.ndarray, list[np.ndarray]]] = {}

    def n_tokens(self, b: int, query_tokens: int) -> int:
        return len(self.prompts) * query_tokens + b * self.const

    def n_reads(self, b: int) -> int:
        return b * self.reads_per_query

    def max_tiles(self, b: int, n: int) -> int:
        """Attention tiles (≤ `tile` tokens of one row, any of `tiles`) any batch of b queries in n tokens can need."""
        return n // min(self.tiles) + b * len(self.prompts) + 2

    def prompt_tokens(self, b: int, query_tokens: int) -> list[int]:
        """Per prompt: the most tokens its b rows can hold in a batch with `query_tokens` query tokens in all."""
        return [query_tokens + b * p.const_len for p in self.prompts]

    def buffer_len(self, b: int, n: int) -> int:
        return (len(FIELDS) + 1) * n + len(self.prompts) + 1 + self.n_reads(b) + TILE_FIELDS * self.max_tiles(b, n)

    def pack(self, batch: list[list[int]], n: int, out: np.ndarray | torch.Tensor, tile: int | None = None) -> None:
        """Write descriptors for `batch` into `out` (int64, buffer_len; a CPU tensor or its numpy view): FIELDS ×
        n, qtok (n), qstart (P + 1), read indices, tiles (of `tile` tokens, default the first of `tiles`).

        Everything but the query ids depends only on the queries' lengths and n: the buffer for those lengths
        is built once (`layout`) and kept, so a request copies it and writes its ids (built per request, the build took
        0.1 ms at batch 1 on an H100 host). Batch-1 layouts of every length are built at start-up (`warm`);
        layouts of larger batches are kept for the last LAYOUTS_KEPT length combinations."""
        tile = tile or self.tiles[0]
        key = (n, tile, *map(len, batch))
        hit = self._permanent.get(key) or self._recent.get(key)
        if hit is None:
            hit = self.layout([len(q) for q in batch], n, tile)
            if len(self._recent) >= LAYOUTS_KEPT:
                self._recent.pop(next(iter(self._recent)))
            self._recent[key] = hit
        flat, where = hit
        o = out if isinstance(out, np.ndarray) else out.numpy()
        o[:len(flat)] = flat
        for q, w in zip(batch, where):  # w [P, len(q)]: the query's ids in each prompt's row
            o[w] = q

    def warm(self, lengths: list[int], n: int, tile: int | None = None) -> None:
        """Build and keep (for good) the layout of a batch of these query lengths in an n-token bucket."""
        tile = tile or self.tiles[0]
        self._permanent[(n, tile, *lengths)] = self.layout(lengths, n, tile)

    def layout(self, lengths: list[int], n: int, tile: int | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
        """The descriptor buffer of a batch of queries of these lengths with every query id 0, and per query
        the flat indices [P, length] where its ids go. The per-length templates laid back to back, each
        shifted by its token offset (and its rows by its query index): a fixed few numpy operations per
        batch, not per query (query by query, a batch of 4 with new lengths took 0.19 ms per-query-wise on an H100
        host)."""
        tile = tile or self.tiles[0]
        if tile not in self.tiles:
            raise ValueError(f"attention tiles of {tile} tokens: the packer holds templates for {self.tiles}")
        ts = []
        for lq in lengths:
            t = self._templates.get(lq)
            if t is None:
                raise ValueError(f"query of {lq} tokens: the packer holds templates for 1–{len(self._templates)}")
            ts.append(t)
        n_p, b, n_f = len(self.prompts), len(ts), len(FIELDS)
        offs = np.cumsum([0] + [t.cols.shape[1] for t in ts])
        off = int(offs[-1])
        if off > n:
            raise ValueError(f"batch needs {off} tokens, bucket holds {n}")
        room = self.max_tiles(b, n)
        n_reads = self.n_reads(b)
        flat = np.zeros(self.buffer_len(b, n), dtype=np.int64)
        cols = flat[:n_f * n].reshape(n_f, n)
        np.concatenate([t.cols for t in ts], 1, out=cols[:, :off])
        qi = np.repeat(np.arange(0, b * n_p, n_p), offs[1:] - offs[:-1])  # each token's query index × P
        cols[2, :off] += qi  # rows are numbered query after query
        cols[QROW, :off] += qi * np.concatenate([t.is_query for t in ts])
        cols[2, off:] = -1 - np.arange(n - off)  # pads: unique rows (a pad shares a row with nothing)
        cols[5, off:] = -1
        cols[6, off:] = n_p
        cols[QROW, off:] = -1
        starts = np.stack([t.row_start for t in ts]) + offs[:-1, None]
        qtok, qstart = self._tokens_by_prompt(starts, np.stack([t.row_len for t in ts]), n)
        at = (n_f + 1) * n
        flat[n_f * n:at] = qtok
        flat[at:at + n_p + 1] = qstart
        at += n_p + 1
        flat[at:at + n_reads] = (np.stack([t.reads for t in ts]) + offs[:-1, None]).ravel()
        at += n_reads
        tiles = np.concatenate([t.tiles[tile] for t in ts])
        shift = np.repeat(offs[:-1], [len(t.tiles[tile]) for t in ts])
        tiles[:, 0] += shift
        tiles[:, 2] += shift
        pad_starts = np.arange(off, n, tile, dtype=np.int64)  # pad tiles: rows of their own, no prefix
        cnt = np.minimum(tile, n - pad_starts)
        pad_tiles = np.stack([pad_starts, cnt, pad_starts, cnt, np.full_like(pad_starts, n_p)], 1)
        if len(tiles) + len(pad_tiles) > room:  # cannot happen by max_tiles' bound; checked: the kernel trusts it
            raise AssertionError(f"{len(tiles) + len(pad_tiles)} attention tiles, room for {room}")
        out_tiles = flat[at:at + TILE_FIELDS * room].reshape(room, TILE_FIELDS)
        out_tiles[:len(tiles)] = tiles
        out_tiles[len(tiles):len(tiles) + len(pad_tiles)] = pad_tiles
        where = [(t.query_at + o).reshape(n_p, t.query_at.shape[0] // n_p) for t, o in zip(ts, offs[:-1].tolist())]
        return flat, where

    def _tokens_by_prompt(self, starts: np.ndarray, lens: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Every row's token indices, prompt after prompt in `order` (rows [b, P] start/length), padded to n;
        and where each prompt's tokens start (P + 1 entries)."""
        s, ln = starts[:, self.order].T.ravel(), lens[:, self.order].T.ravel()
        ends = np.cumsum(ln)
        qtok = np.zeros(n, dtype=np.int64)
        qtok[:ends[-1]] = np.arange(ends[-1]) + np.repeat(s - (ends - ln), ln)
        return qtok, np.concatenate([[0], ends[len(starts) - 1::len(starts)]])


@dataclass
class _QueryTemplate:
    """Descriptors of the P rows of one query of a given length, query ids left as zeros."""
    cols: np.ndarray  # [len(FIELDS), tokens]
    query_at: np.ndarray  # token indices where the query's ids go, prompt after prompt
    reads: np.ndarray  # read token indices
    tiles: dict[int, np.ndarray]  # per tile size: [tiles, TILE_FIELDS]
    row_start: np.ndarray  # per prompt: its row's first token
    row_len: np.ndarray
    is_query: np.ndarray = field(init=False)  # 1 at the query's tokens (their qrow is a row), else 0

    def __post_init__(self) -> None:
        self.is_query = (self.cols[QROW] >= 0).astype(np.int64)

    @staticmethod
    def build(prompts: list[PromptLayout], lq: int, sizes: tuple[int, ...] = TILES) -> "_QueryTemplate":
        cols: dict[str, list[int]] = {f: [] for f in FIELDS}
        query_at, reads, row_start, row_lens = [], [], [], []
        tiles: dict[int, list] = {t: [] for t in sizes}
        for p, pl in enumerate(prompts):
            start = len(cols["ids"])
            lp, suf = len(pl.tokens.prefix_ids), pl.tokens.suffix_ids
            seq_len = lq + len(suf)
            row_len = seq_len + len(pl.trie_ids)
            row_start.append(start)
            row_lens.append(row_len)
            query_at += range(start, start + lq)
            cols["ids"] += [0] * lq + list(suf) + pl.trie_ids
            cols["pos"] += list(range(lp, lp + seq_len)) + [lp + seq_len - 1 + d for d in pl.trie_depth]
            cols["row"] += [p] * row_len
            cols["seq"] += list(range(seq_len)) + [TRIE_SEQ] * len(pl.trie_ids)
            cols["anc"] += [0] * seq_len + pl.trie_anc
            cols["tslot"] += [-1] * seq_len + list(range(len(pl.trie_ids)))
            cols["prompt"] += [p] * row_len
            cols["qrow"] += [p] * lq + [-1] * (row_len - lq)
            reads += [start + seq_len - 1 if s < 0 else start + seq_len + s for s in pl.read_slots]
            for size, rows in tiles.items():
                rows += [[start + t, min(size, row_len - t), start, row_len, p] for t in range(0, row_len, size)]
        arr = np.array([cols[f] for f in FIELDS], dtype=np.int64)
        return _QueryTemplate(arr, np.array(query_at, dtype=np.int64), np.array(reads, dtype=np.int64),
                              {k: np.array(v, dtype=np.int64).reshape(-1, TILE_FIELDS) for k, v in tiles.items()},
                              np.array(row_start, dtype=np.int64), np.array(row_lens, dtype=np.int64))


def unpack(buf: torch.Tensor, n: int, n_reads: int, n_prompts: int) -> dict[str, torch.Tensor]:
    """Views of the descriptor buffer (host or device)."""
    views = {f: buf[i * n:(i + 1) * n] for i, f in enumerate(FIELDS)}
    at = len(FIELDS) * n
    views["qtok"] = buf[at:at + n]
    views["qstart"] = buf[at + n:at + n + n_prompts + 1]
    at += n + n_prompts + 1
    views["read"] = buf[at:at + n_reads]
    views["tiles"] = buf[at + n_reads:]
    return views


def build_mask(d: dict[str, torch.Tensor], visible: torch.Tensor, key_len: int, window: int = 0,
               slot_pos: torch.Tensor | None = None) -> torch.Tensor:
    """[N, key_len] bool attention mask from the descriptors (see the module docstring); with window > 0
    the sliding-window rule too, for which `slot_pos` (Packer.slot_pos) gives the pool slots' positions."""
    n = d["ids"].shape[0]
    same_row = d["row"][:, None] == d["row"][None, :]
    seq_ok = d["seq"][None, :] <= d["seq"][:, None]
    tree_ok = ((d["anc"][:, None] >> d["tslot"].clamp_min(0)[None, :]) & 1).bool()
    own = same_row & torch.where((d["tslot"] < 0)[None, :], seq_ok, tree_ok)
    pool = visible[d["prompt"]]
    tail = own.new_zeros(n, key_len - pool.shape[1] - n)
    mask = torch.cat([pool, own, tail], 1)
    if window > 0:
        if slot_pos is None:
            raise ValueError("a sliding window needs the pool slots' positions (slot_pos)")
        key_pos = torch.cat([slot_pos, d["pos"], d["pos"].new_zeros(tail.shape[1])])
        mask &= (d["pos"][:, None] - key_pos[None, :]) < window
    return mask
