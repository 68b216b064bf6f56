"""The fast engine: every prompt of up to `max_batch_size` queries in one packed forward.

Start-up (constructor): plan and fill the prefix KV pool, build every (batch size, query bucket) layout
with its static buffers, and on a GPU capture one CUDA graph per bucket for the forward and one for the
tail. Request path (`run`): copy the query ids into the bucket's input buffer, replay, read the scores.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from qcls.engine.decoder import Decoder
from qcls.engine.layout import BucketLayout, PromptLayout, build_bucket
from qcls.engine.prefix_cache import plan_prefixes
from qcls.engine.tail import Tail


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Bucket:
    """Static buffers of one (b, Qb) bucket and the computation over them (captured as is on a GPU)."""

    def __init__(self, lay: BucketLayout, dec: Decoder, tail: Tail, pool_len: int, embed_fn):
        dev = dec.device
        self.lay, self.dec, self.tail, self.pool_len, self.embed_fn = lay, dec, tail, pool_len, embed_fn
        self.qin_host = torch.zeros(lay.b, lay.qb + 1, dtype=torch.long, pin_memory=dev.type == "cuda")
        self.qin = torch.zeros(lay.b, lay.qb + 1, dtype=torch.long, device=dev)
        for name in ("ids_static", "is_query", "query_src", "from_end", "row_query", "pos_base", "static_mask",
                     "read_idx"):
            setattr(self, name, getattr(lay, name).to(dev))
        n = lay.n_tokens
        # A pad slot sees itself, so no softmax row is empty; pads are never read.
        self.self_key = torch.zeros(n, lay.key_len, dtype=torch.bool, device=dev)
        self.self_key[torch.arange(n), pool_len + torch.arange(n)] = True
        self.pool_keys = torch.ones(pool_len, dtype=torch.bool, device=dev)
        self.pad_keys = torch.zeros(lay.key_len - pool_len - n, dtype=torch.bool, device=dev)
        self.zero = torch.zeros((), dtype=dec.dtype, device=dev)
        self.neg = torch.full((), float("-inf"), dtype=dec.dtype, device=dev)
        self.embeds = None
        if embed_fn is not None:  # the backend gathers embeddings itself (table off the device)
            self.embeds = torch.zeros(n, dec.embed.embedding_dim, dtype=dec.dtype, device=dev)
        self.hidden = self.scores = None
        self.graphs: tuple[torch.cuda.CUDAGraph, torch.cuda.CUDAGraph] | None = None

    def forward(self) -> torch.Tensor:
        qids, qlen = self.qin[:, :-1], self.qin[:, -1]
        ql = qlen[self.row_query]
        ids = torch.where(self.is_query, qids.reshape(-1)[self.query_src], self.ids_static)
        pos = (self.pos_base + ql).clamp_min(0)
        key_ok = torch.cat([self.pool_keys, ~self.is_query | (self.from_end <= ql), self.pad_keys])
        allowed = (self.static_mask & key_ok) | self.self_key
        mask = torch.where(allowed, self.zero, self.neg)
        n = self.lay.n_tokens
        self.hidden = self.dec.forward(ids, pos, slice(self.pool_len, self.pool_len + n), self.lay.key_len, mask,
                                       self.read_idx, self.embeds)
        return self.hidden

    def score(self) -> torch.Tensor:
        self.scores = self.tail(self.hidden)
        return self.scores

    def load(self, batch: list[list[int]]) -> None:
        host = self.qin_host
        host.zero_()
        for i, ids in enumerate(batch):
            host[i, self.lay.qb - len(ids):self.lay.qb] = torch.tensor(ids, dtype=torch.long)
            host[i, -1] = len(ids)
        self.qin.copy_(host, non_blocking=True)
        if self.embed_fn is not None:
            ids = torch.where(self.lay.is_query, host[:, :-1].reshape(-1)[self.lay.query_src], self.lay.ids_static)
            self.embed_fn(ids, self.embeds)

    def capture(self, pool) -> None:
        dev = self.dec.device
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for _ in range(2):
                self.forward()
                self.score()
        torch.cuda.current_stream(dev).wait_stream(side)
        g_fwd, g_tail = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(g_fwd, pool=pool):
            self.forward()
        with torch.cuda.graph(g_tail, pool=pool):
            self.score()
        self.graphs = (g_fwd, g_tail)


@dataclass
class EngineStats:
    prefix: dict
    buckets: list[tuple[int, int, int]]  # (b, Qb, tokens per forward)
    graphs: bool
    kv_buffer_bytes: int


class FastEngine:
    def __init__(self, model, prompts: list[PromptLayout], head_rows: torch.Tensor, head_tokens: list[int],
                 full_head: torch.Tensor | None, *, max_batch: int, query_buckets: list[int], block_size: int,
                 vocab_chunk: int, use_graphs: bool, embed_fn=None):
        self.prompts = prompts
        self.embed_fn = embed_fn
        self.pool = plan_prefixes([p.tokens.prefix_ids for p in prompts], block_size)
        self.pool_len = self.pool.n_slots + (-self.pool.n_slots) % 8
        self.query_buckets = list(query_buckets)
        self.max_batch = max_batch
        biggest = sum(p.row_len(self.query_buckets[-1]) for p in prompts) * max_batch
        self.dec = Decoder(model, self.pool_len + biggest + 16)
        self.device = self.dec.device
        self._check_positions()
        with torch.inference_mode():
            self._fill_prefix_pool()
            tails = {b: Tail([p.plan for p in prompts], b, head_rows, head_tokens, full_head, vocab_chunk, self.device)
                     for b in range(1, max_batch + 1)}
            self.buckets = {(b, qb): Bucket(build_bucket(prompts, self.pool, self.pool_len, b, qb), self.dec,
                                            tails[b], self.pool_len, embed_fn)
                            for b in range(1, max_batch + 1) for qb in self.query_buckets}
        self.graphs = use_graphs and self.device.type == "cuda"
        if self.graphs:
            pool = torch.cuda.graph_pool_handle()
            with torch.inference_mode():
                for key in sorted(self.buckets, key=lambda k: -self.buckets[k].lay.n_tokens):
                    self.buckets[key].capture(pool)

    def _check_positions(self) -> None:
        worst = max(len(p.tokens.prefix_ids) + p.row_len(self.query_buckets[-1]) for p in self.prompts)
        if worst > self.dec.max_positions:
            raise ValueError(f"a prompt row reaches position {worst}, over the model's max_position_embeddings="
                             f"{self.dec.max_positions}: shorten the prompt or the largest query bucket")

    def _fill_prefix_pool(self) -> None:
        """Run each prompt's not-yet-cached prefix blocks through the decoder, writing their K/V into the
        pool slots; earlier blocks (possibly another prompt's) are read where they lie."""
        dev, key_len = self.device, self.pool_len
        for p, new in enumerate(self.pool.new_blocks):
            if not new:
                continue
            slots = torch.tensor(self.pool.prompt_slots(p), device=dev)
            blocks = [self.pool.blocks[b] for b in new]
            ids = torch.tensor([t for bl in blocks for t in bl.tokens], device=dev)
            pos = torch.tensor([bl.position + i for bl in blocks for i in range(len(bl.tokens))], device=dev)
            write = torch.tensor([bl.start + i for bl in blocks for i in range(len(bl.tokens))], device=dev)
            allowed = torch.zeros(len(ids), key_len, dtype=torch.bool, device=dev)
            slot_pos = torch.arange(len(slots), device=dev)  # position of each of the prompt's slots
            allowed[:, slots] = slot_pos[None, :] <= pos[:, None]
            mask = torch.zeros(allowed.shape, dtype=self.dec.dtype, device=dev).masked_fill(~allowed, float("-inf"))
            embeds = None
            if self.embed_fn is not None:
                embeds = torch.empty(len(ids), self.dec.embed.embedding_dim, dtype=self.dec.dtype, device=dev)
                self.embed_fn(ids.cpu(), embeds)
            self.dec.forward(ids, pos, write, key_len, mask, torch.tensor([0], device=dev), embeds)

    def bucket_for(self, batch: list[list[int]]) -> Bucket:
        longest = max(len(ids) for ids in batch)
        qb = next((q for q in self.query_buckets if q >= longest), None)
        if qb is None or len(batch) > self.max_batch:
            raise ValueError(f"batch of {len(batch)} queries, longest {longest} tokens, exceeds the engine's "
                             f"limits (max_batch_size={self.max_batch}, largest query bucket {self.query_buckets[-1]})")
        return self.buckets[(len(batch), qb)]

    @torch.inference_mode()
    def run(self, batch: list[list[int]]) -> tuple[list[list[torch.Tensor]], dict[str, float], int]:
        """Scores per query per prompt for a batch of query ids; stage times in ms; tokens per forward."""
        dev, t = self.device, {}
        t0 = time.perf_counter()
        bk = self.bucket_for(batch)
        bk.load(batch)
        _sync(dev)
        t1 = time.perf_counter()
        bk.graphs[0].replay() if bk.graphs else bk.forward()
        _sync(dev)
        t2 = time.perf_counter()
        bk.graphs[1].replay() if bk.graphs else bk.score()
        flat = bk.scores.cpu()  # the copy back synchronises
        t3 = time.perf_counter()
        t.update(prepare=(t1 - t0) * 1e3, forward=(t2 - t1) * 1e3, score=(t3 - t2) * 1e3)
        out, i = [], 0
        for _ in batch:
            per = []
            for n in bk.tail.label_counts:
                per.append(flat[i:i + n])
                i += n
            out.append(per)
        return out, t, bk.lay.n_tokens

    def stats(self) -> EngineStats:
        return EngineStats(self.pool.stats(), [(k[0], k[1], b.lay.n_tokens) for k, b in sorted(self.buckets.items())],
                           self.graphs, self.dec.kv_bytes)
