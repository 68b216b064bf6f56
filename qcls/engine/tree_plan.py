"""Which program of the tree attention reads which prefix keys: the per-bucket plan, built at start-up.

Long prefixes are cut into chunks so that many programs read them at once (flash-decoding style), and a
chunk is read by one program for every query token that sees it:

- Runs: along each prompt's prefix, maximal runs of pool slots seen by the same prompts. Sharing is always
  of leading blocks (prefix_cache.py's chain hash), so once prompts are ordered by their block chains
  (PrefixPlan.prompt_order) the prompts that see a run form a contiguous range of that order, and the Packer lists
  their query tokens contiguously too (`qtok`, `qstart`): a shared system block is one run of all prompts.
- Chunks: a run cut every `chunk` keys; a chunk's index along the prefix (its split) is the same for every
  prompt that shares it. Chunk size per run: the smallest power of two in [min_chunk, max_chunk] for
  which the partial states written (query vectors that see the chunk × head_dim, fp32) stay within
  `partial_ratio` × the chunk's K/V bytes, so the partials cost little traffic beside the keys; the cap
  keeps runs that many tokens see (a shared block, batch 4) spread over enough programs, but never lets
  the partials pass `partial_limit` × the keys (large buckets split little: their query blocks are
  parallel enough).
- Work items: (chunk, QB blocks of BQ query tokens of its prompts). The bucket fixes how many query tokens
  a prompt can have (its total query tokens + b × the prompt's row constant), so the work list and the
  grid are fixed per bucket; items past a request's real tokens return at once.

Buckets where no prompt's prefix keys × its tiles (each row-kernel program re-reads the prefix) pass
`inline_reads` use no chunks: the row kernel walks the prefix itself (one launch per layer instead of two;
at batch 1 a prompt has one or two tiles, at batch 4 four or more, so the same prefix is walked inline at
batch 1 and split at batch 4 once it is long enough), run by run (`prefix_runs`: a prompt's blocks merged where
their pool slots are contiguous, usually one or two runs), so its key addresses follow from the loop index
and no slot table is read on the way.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch

from qcls.engine.layout import Packer
from qcls.engine.prefix_cache import PrefixPlan
from qcls.engine.tree_kernels import RUN_FIELDS, TILE, WORK_FIELDS


@dataclass(frozen=True)
class Tuning:
    """Kernel shapes and the split rule."""
    inline_reads: int = 512  # the row kernel walks the prefixes itself while no prompt's keys × tiles pass this
    partial_ratio: float = 0.25  # partial-state bytes ≤ this × the chunk's K/V bytes …
    min_chunk: int = 128
    max_chunk: int = 512  # … but no bigger chunks than this: a run many tokens see still spreads over programs,
    partial_limit: float = 1.0  # unless the partials would then pass this × the keys
    bq: int = 16  # prefix kernel: query tokens per block
    qb: int = 1  # prefix kernel: query blocks per program (the chunk is re-read from cache for each)
    bn: int = 32  # prefix kernel: keys per step
    warps: int = 4
    stages: int = 2  # software pipelining of the key loads (sm_80+)
    row_tile: int = TILE  # row kernel: tokens per program (the tiles the Packer writes: Packer.pack(tile=))
    row_bt: int = 16  # row kernel: tokens per pass (divides row_tile)
    row_bn: int = 32  # row kernel: keys per step
    row_warps: int = 4
    row_stages: int = 3
    row_maxnreg: int = 0  # row kernel: registers per thread in crowded buckets (0: ptxas's choice everywhere) …
    row_crowded: float = 0.0  # … a bucket is crowded when its row grid, at an even split of its query tokens, has
    # more programs than this per SM: more programs resident per SM (one wave, not two) then pay for the spills
    sms: int = 0  # the device's SMs (tuning_for; 0: no bucket is crowded)
    row_head_split: int = 1  # row kernel, batch-1 buckets: a KV head's query heads split over up to this many
    # programs (head_split): one row per prompt makes a small grid (Gemma3-4B on ecommerce8: 40 programs, 132 SMs)
    merge_warps: int = 0  # row kernel warps in batch-1 buckets whose prefixes are split (0: row_warps): one program
    # per prompt and KV head then merges every partial state of its tile, and more warps share that work
    row_keys_in_registers: bool = False  # fused q/k/v: the row kernel rotates its row's keys in registers at each
    # step; otherwise it writes them to the KV buffer first and reads them back after a barrier (row_kernel.py)
    wide_tile: int = 0  # row kernel, buckets its row_tile crowds (more programs than SMs) where tiles of this many
    # tokens fit one program per SM: those tiles, in one pass, without a register limit (0: never). A row a token
    # longer than row_tile is then one program, not two that each walk the whole prefix
    row_early_loads: bool = True  # row kernel: its index loads before the first barrier (row_kernel.py, EARLY;
    # off on sm_75, where at d=256 the values held that long spill registers)
    row_early_q: bool = False  # row kernel: its query vectors' loads before it writes the row's keys (row_kernel.py)
    row_early_kv: bool = False  # row kernel: the first step of its prompt's prefix loaded there too (with EARLY only)
    row_values_with_keys: bool = False  # row kernel: each step's values loaded with its keys, before the scores
    unmasked: bool = False  # prefix kernel: whole key steps without masks, then a masked last step (sm_80+: on
    # sm_75 the second copy of the step spills registers)

    def with_(self, **kw) -> "Tuning":
        return replace(self, **kw)


# Tensor-core GPUs (sm_80+), per head_dim: the shapes that timed fastest on H100/H200 (d=128 on Qwen3-4B, d=256
# on Gemma3-4B, d=64 not timed); each entry's runs: bench/RESULTS.md, "Tree-plan tuning notes".
TUNING: dict[int, Tuning] = {
    64: Tuning(bn=64),
    # stages=3, partial_ratio: the kernel-shape sweep's fastest
    # unmasked: whole key steps add 2-11 % less time on 256-token to 2k prefixes (64-key steps: no faster)
    # inline_reads=1536: the few-shot prefixes stay inline at batch 1 and 4 (splitting them added 0.09 ms)
    # merge_warps=8: 6-9 % less added time in batch-1 buckets with split prefixes
    # row_bn=16, 168 registers where more than 2 programs per SM are needed: 9-12 % less attention time
    # row_keys_in_registers: 4-9 % faster at batches 1-3 (at head_dim 256 it costs 7-8 %)
    # row_values_with_keys stays off: faster in the row kernel alone, slower in the engine
    128: Tuning(inline_reads=1536, partial_ratio=0.125, stages=3, unmasked=True, merge_warps=8, row_bn=16,
                row_maxnreg=168, row_crowded=2.0, row_keys_in_registers=True),
    # row_stages=2, 96 registers past one program per SM: batch 4 13 % faster, batches 1-3 unchanged
    # row_head_split=2 (batch 1 only): 18 % faster at batch 1, slower at batches 2-4
    # wide_tile=32: 23 % faster where 16-token tiles crowd the SMs (batch 4), slower elsewhere
    # row_early_q, row_early_kv, row_values_with_keys: 6 % less attention time at batch 1 (off in widened buckets)
    # bn=32, row_warps=8: 64-key steps, 16 warps, 1 or 3 stages were no faster at any batch
    256: Tuning(bn=32, row_warps=8, row_stages=2, row_maxnreg=96, row_crowded=1.0, row_head_split=2, wide_tile=32,
                row_early_q=True, row_early_kv=True, row_values_with_keys=True),
}


def tuning_for(head_dim: int, group: int, device: torch.device | None = None) -> Tuning:
    """The kernel shapes for this head shape and device. On Turing (sm_75: dots on FMA units, 64 KiB of
    shared memory per block) a program holds at most 8192 / head_dim query vectors (tokens × the group's
    heads) and steps 16 keys with 8 warps: what ptxas compiles for sm_75 without register spills and within
    48 KiB of shared memory (read from the compiled kernels; not timed on a T4)."""
    gp = 1 << max(0, group - 1).bit_length()  # the group's heads, padded to a power of two in the kernels
    if device is not None and device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 0):
        tokens = max(1, 8192 // head_dim // gp)
        t = Tuning(bq=tokens, bn=16, warps=8, stages=1, row_bt=min(16, tokens), row_bn=16, row_warps=8,
                   row_stages=1, row_early_loads=False)
    else:
        t = TUNING.get(head_dim) or TUNING[128]
    if device is not None and device.type == "cuda" and torch.cuda.is_available():
        t = t.with_(sms=torch.cuda.get_device_properties(device).multi_processor_count)
    # a dot needs ≥ 16 query vectors (tokens × padded group, in the row kernel the padded part of the group)
    rp = 1 << max(0, group // head_split(t, group) - 1).bit_length()
    return t.with_(bq=max(t.bq, 16 // gp), row_bt=max(t.row_bt, 16 // rp))


def head_split(tuning: Tuning, group: int) -> int:
    """Programs per KV head and tile of the row kernel: Tuning.row_head_split, cut to a divisor of the group."""
    return math.gcd(group, tuning.row_head_split)


def row_programs(prompt_tokens: list[int], b: int, kv_heads: int, tile: int = TILE) -> int:
    """Row-kernel programs that hold tokens when the bucket's query tokens are split evenly over its b queries:
    b rows per prompt of ⌈tokens / b⌉, each ⌈/ tile⌉ tiles, per KV head (the grid's room for uneven splits
    is larger; its empty tiles return at once). `kv_heads`: the grid's columns (KV heads × head_split)."""
    return kv_heads * sum(b * math.ceil(math.ceil(t / b) / tile) for t in prompt_tokens)


def crowded(tuning: Tuning, prompt_tokens: list[int], b: int, kv_heads: int) -> Tuning:
    """The tuning with its register limit only where the bucket is crowded (Tuning.row_crowded). Under the limit
    the row's keys go through the KV buffer: rotated in registers they spill (Qwen3-4B at batch 4, 0.500 → 0.526 ms)."""
    if tuning.row_maxnreg and tuning.sms and \
            row_programs(prompt_tokens, b, kv_heads, tuning.row_tile) > tuning.row_crowded * tuning.sms:
        return tuning.with_(row_keys_in_registers=False)
    return tuning.with_(row_maxnreg=0)


def widened(tuning: Tuning, prompt_tokens: list[int], b: int, kv_heads: int) -> Tuning:
    """The tuning with Tuning.wide_tile's tiles where the bucket's row_tile crowds the SMs and they do not (b > 1,
    one KV head per program: head_split's batch-1 grid is the other way to use the SMs)."""
    w = tuning.wide_tile
    if not (w and tuning.sms and b > 1) or row_programs(prompt_tokens, b, kv_heads, tuning.row_tile) <= tuning.sms or \
            row_programs(prompt_tokens, b, kv_heads, w) > tuning.sms:
        return tuning
    # (the early loads held through a 32-token tile spilled: Gemma3-4B at batch 4, 0.556 → 0.705 ms)
    return tuning.with_(row_tile=w, row_bt=w, row_maxnreg=0, row_early_q=False, row_early_kv=False,
                        row_values_with_keys=False)


@dataclass
class Chunk:
    slot: int  # first pool slot (the chunk's slots are contiguous)
    keys: int
    pos: int  # position of its first key within the prefix
    split: int  # index along the prefix of every prompt that sees it
    lo: int  # prompts that see it: order[lo:hi]
    hi: int


@dataclass
class _Run:
    lo: int
    hi: int
    slot: int
    pos: int
    keys: int


def plan_chunks(pool: PrefixPlan, order: list[int], chunk_size) -> tuple[list[Chunk], list[int]]:
    """Chunks of every prefix (each emitted once, by the first prompt of its range) and the number of
    chunks per prompt; `chunk_size(lo, hi)` gives the size for a run seen by order[lo:hi]."""
    rank = {p: i for i, p in enumerate(order)}
    users: dict[int, list[int]] = {}
    for p, blocks in enumerate(pool.prompt_blocks):
        for b in blocks:
            users.setdefault(b, []).append(rank[p])
    chunks, n_splits = [], [0] * len(order)
    for p in order:
        runs: list[_Run] = []
        for b in pool.prompt_blocks[p]:
            r, blk = users[b], pool.blocks[b]
            lo, hi = min(r), max(r) + 1
            if hi - lo != len(r):
                raise AssertionError(f"block {b} is shared by prompts {r} of the order, not a contiguous range")
            last = runs[-1] if runs else None
            if last and (last.lo, last.hi) == (lo, hi) and last.slot + last.keys == blk.start:
                last.keys += len(blk.tokens)
            else:
                runs.append(_Run(lo, hi, blk.start, blk.position, len(blk.tokens)))
        k = 0
        for run in runs:
            size = chunk_size(run.lo, run.hi)
            for off in range(0, run.keys, size):
                if run.lo == rank[p]:
                    chunks.append(Chunk(run.slot + off, min(size, run.keys - off), run.pos + off, k, run.lo, run.hi))
                k += 1
        n_splits[p] = k
    return chunks, n_splits


@dataclass
class TreePlan:
    """Device tables of one bucket (prompt index P is the pads' row: no prefix)."""
    tuning: Tuning
    work: torch.Tensor  # [items, WORK_FIELDS] int64; empty when every prefix is walked inline
    n_splits: torch.Tensor  # [P + 1] partial states per prompt
    inline_runs: torch.Tensor  # [P + 1] runs of its prefix the row kernel walks itself (0: split or none)
    runs: torch.Tensor  # [P + 1, R, RUN_FIELDS] every prompt's prefix runs (prefix_runs)
    max_splits: int
    chunks: list[Chunk] = field(default_factory=list)

    def to(self, device) -> "TreePlan":
        return replace(self, work=self.work.to(device), n_splits=self.n_splits.to(device),
                       inline_runs=self.inline_runs.to(device), runs=self.runs.to(device))


def prefix_runs(pool: PrefixPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """([P + 1, R, RUN_FIELDS] (first pool slot, keys, position of the first key) of each prompt's maximal
    runs of contiguous slots, [P + 1] runs per prompt); the last row (the pads') has none."""
    per_prompt = []
    for blocks in pool.prompt_blocks:
        runs: list[list[int]] = []
        for b in blocks:
            blk = pool.blocks[b]
            if runs and runs[-1][0] + runs[-1][1] == blk.start:
                runs[-1][1] += len(blk.tokens)
            else:
                runs.append([blk.start, len(blk.tokens), blk.position])
        per_prompt.append(runs)
    table = torch.zeros(len(per_prompt) + 1, max([len(r) for r in per_prompt] + [1]), RUN_FIELDS, dtype=torch.long)
    for p, runs in enumerate(per_prompt):
        if runs:
            table[p, :len(runs)] = torch.tensor(runs)
    return table, torch.tensor([len(r) for r in per_prompt] + [0], dtype=torch.long)


def inline_reads(prefix_len: list[int], prompt_tokens: list[int], b: int, tile: int = TILE) -> int:
    """Prefix keys the slowest prompt's tiles would read walking it inline: its keys × its tiles (at least one
    per row, b rows)."""
    return max([n * max(b, -(-t // tile)) for n, t in zip(prefix_len, prompt_tokens)] + [0])


def plan_tree(packer: Packer, b: int, query_tokens: int, group: int, tuning: Tuning, kv_heads: int = 0) -> TreePlan:
    """The plan of the bucket of b queries with `query_tokens` query tokens in all, for a model whose
    `kv_heads` KV heads each serve `group` query heads (kv_heads 0: no bucket counts as crowded)."""
    order, prefix_len = packer.order, packer.prefix_len
    zeros = torch.zeros(len(order) + 1, dtype=torch.long)
    runs, n_runs = prefix_runs(packer.pool)
    prompt_tokens = packer.prompt_tokens(b, query_tokens)
    if b > 1:  # (Tuning.row_head_split: batch-1 buckets only)
        tuning = tuning.with_(row_head_split=1)
    tuning = crowded(widened(tuning, prompt_tokens, b, kv_heads), prompt_tokens, b, kv_heads * head_split(tuning, group))
    if tuning.row_tile not in packer.tiles or tuning.row_tile % tuning.row_bt:
        raise ValueError(f"the row kernel's tiles of {tuning.row_tile} tokens in passes of {tuning.row_bt}: the "
                         f"Packer writes tiles of {packer.tiles}")
    if inline_reads(prefix_len.tolist(), prompt_tokens, b, tuning.row_tile) <= tuning.inline_reads:
        return TreePlan(tuning, torch.zeros(0, WORK_FIELDS, dtype=torch.long), zeros, n_runs, runs, 0)
    tokens_in = [0]
    for p in order:
        tokens_in.append(tokens_in[-1] + prompt_tokens[p])

    def chunk_size(lo: int, hi: int) -> int:
        vectors = (tokens_in[hi] - tokens_in[lo]) * group  # partial states per KV head, each head_dim wide
        cap = max(tuning.max_chunk, vectors / tuning.partial_limit)
        size = tuning.min_chunk
        while size < vectors / tuning.partial_ratio and size < cap:
            size *= 2
        return size

    chunks, n_splits = plan_chunks(packer.pool, order, chunk_size)
    work = []
    for c in chunks:
        blocks = -(-(tokens_in[c.hi] - tokens_in[c.lo]) // tuning.bq)
        work += [[c.slot, c.keys, c.pos, c.split, c.lo, c.hi, j] for j in range(0, blocks, tuning.qb)]
    splits = torch.tensor(n_splits + [0], dtype=torch.long)
    if b == 1 and tuning.merge_warps:
        tuning = tuning.with_(row_warps=tuning.merge_warps)
    return TreePlan(tuning, torch.tensor(work, dtype=torch.long).reshape(-1, WORK_FIELDS), splits, zeros, runs,
                    int(splits.max()), chunks)
