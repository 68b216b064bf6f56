"""The fast engine: every prompt of up to `max_batch_size` queries in one packed forward.

Start-up: the constructor plans the prefix KV pool and allocates the decoder's buffers; `build()` then runs the device
work one step per `next()` (fill each prompt's prefix blocks, build every (batch size, total query tokens) bucket with
its static buffers, and on a GPU capture one CUDA graph per bucket for the forward and one for the tail), so that
whoever owns the device decides what runs between two steps. Request path (`run` = `launch` + `collect`): pack the batch
into the bucket's descriptor buffer, queue the replays and the copy back, then wait and read the scores. A server
launches the next batch before collecting the current one, so its host work overlaps the device's."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Iterator

import torch

from qcls.engine.attention import DenseAttention, tree_available
from qcls.engine.bucket import SLOTS, Bucket, token_buckets  # noqa: F401  (token_buckets: the engine's bucket shapes)
from qcls.engine.decoder import Decoder
from qcls.engine.layout import Packer, PromptLayout
from qcls.engine.prefix_cache import plan_prefixes
from qcls.engine.probs import split_blocks
from qcls.engine.tail import Tail
from qcls.engine.taps import TapPlan, root_reads
from qcls.heads.head import FINAL, PromptHead, Tap


Scores = list[list[list[float]]]  # per query, per prompt, per label


@dataclass
class InFlight:
    """A launched batch: its bucket, its host slot and, on a GPU, the events that time and complete it."""

    bucket: Bucket
    batch_size: int
    slot: int
    started: float  # perf_counter at launch
    prepare_ms: float  # packing and queueing on the host
    events: tuple | None = None  # (forward start, forward end, scores on the host)
    host_ms: tuple[float, float] = (0.0, 0.0)  # forward, score when the host computed them itself (no GPU)


@dataclass
class EngineStats:
    prefix: dict
    buckets: list[tuple[int, int, int]]  # (b, query tokens in the batch, tokens per forward)
    graphs: bool
    attention: str
    kv_buffer_bytes: int


_capture_streams: dict[torch.device, torch.cuda.Stream] = {}


def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """The stream every engine of this process captures its graphs on: cuBLAS keeps a workspace per stream for
    the life of the process, so a stream per build would leave one more workspace behind with every reload."""
    if device not in _capture_streams:
        _capture_streams[device] = torch.cuda.Stream(device)
    return _capture_streams[device]


class FastEngine:
    def __init__(self, model, prompts: list[PromptLayout], head_rows: torch.Tensor, head_tokens: list[int],
                 full_head: torch.Tensor | None, *, max_batch: int, query_buckets: list[int], block_size: int,
                 vocab_chunk: int, use_graphs: bool, embed_fn=None, attention: str = "auto",
                 heads: list[PromptHead | None] | None = None, taps: list[Tap] = (), qkv_heads: int = 0,
                 fuse_post_norms: bool = True, fuse_qkv_attention: bool = True, fuse_tail: bool = True,
                 stop_after: int | None = None):
        """`heads`: per prompt its head (a calibration or a learned head) or None, built into the tail's
        tables; `taps`: hidden states to keep from every forward besides those the heads read (`states`,
        for fitting heads); `qkv_heads`, `fuse_post_norms`, `fuse_qkv_attention`, `fuse_tail`: engine.qkv_heads_per_program,
        engine.fuse_post_norms, engine.fuse_qkv_attention, engine.fuse_tail; `stop_after`: the forward runs this
        many layers and ends with the heads' read (no final norm, no label scores: qcls/heads/depth.py). Usable once
        `build()` has run to its end."""
        self.prompts = prompts
        self.embed_fn = embed_fn
        self.pool = plan_prefixes([p.tokens.prefix_ids for p in prompts], block_size)
        self.pool_len = self.pool.n_slots + (-self.pool.n_slots) % 8
        self.query_buckets = list(query_buckets)
        self.max_batch = max_batch
        self.packer = Packer(prompts, self.pool, self.pool_len, self.query_buckets[-1])
        biggest = self.packer.n_tokens(max_batch, max_batch * self.query_buckets[-1])
        # the highest position + 1 a token can reach: a prompt's prefix, the longest query, its row constants
        self.reach = max(len(p.tokens.prefix_ids) + self.query_buckets[-1] + p.const_len for p in prompts)
        self.dec = Decoder(model, self.pool_len + biggest + 16, self.reach, qkv_heads, fuse_post_norms,
                           fuse_qkv_attention, stop_after)
        self.device = self.dec.device
        self.attention, self.notes = self._pick_attention(attention)
        self._check_positions()
        wanted = [t for h in (heads or []) if h is not None and h.read is not None for t in h.read.taps]
        self.taps = list(dict.fromkeys(wanted + list(taps)))
        self._check_taps()
        self._tail_args = (head_rows, head_tokens, full_head, vocab_chunk, heads, fuse_tail)
        self.buckets: dict[tuple[int, int], Bucket] = {}
        self.graphs = use_graphs and self.device.type == "cuda"
        self._free = list(range(SLOTS))
        self._launching = threading.Lock()
        self._events = [tuple(torch.cuda.Event(enable_timing=True) for _ in range(3)) for _ in range(SLOTS)] \
            if self.device.type == "cuda" else []
        # The stream every request runs on (graph replays and copies go to the current stream, which is the
        # default stream in any thread that sets none; qcls sets none): the events name it rather than look it
        # up three times a request (a Python lookup of ~10 µs each on an H100 host).
        self._stream = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None

    def build(self) -> Iterator[str]:
        """The start-up's device work, one step per `next()`, each yielding what it did: each prompt's prefix fill,
        each bucket, and on a GPU each bucket's capture (its warm-up, then each of its two graphs). No step leaves
        work on the device or a context open for the next, so the owner of the device may run batches of another
        engine in between."""
        yield from self._fill_prefix_pool()
        head_rows, head_tokens, full_head, vocab_chunk, heads, fuse_tail = self._tail_args
        hidden = self.dec.norm.weight.shape[0]
        with torch.inference_mode():
            tails = {b: Tail([p.plan for p in self.prompts], b, head_rows, head_tokens, full_head, vocab_chunk,
                             self.device, heads, self.taps, hidden, fuse_tail) for b in range(1, self.max_batch + 1)}
            plans = {b: TapPlan(self.taps, b, root_reads([len(p.plan.read_nodes) for p in self.prompts], b), hidden,
                                self.device) if self.taps else None for b in range(1, self.max_batch + 1)}
        for b in range(1, self.max_batch + 1):
            for lt in token_buckets(self.query_buckets, b):
                with torch.inference_mode():
                    self.buckets[b, lt] = Bucket(b, lt, self.packer, self.dec, tails[b], self.pool_len, self.embed_fn,
                                                 self.attention == "tree", plans[b])
                yield f"bucket {b}×{lt}: buffers and plan"
        for lq in range(1, self.query_buckets[-1] + 1):  # a lone query's descriptors: copied, never built
            bk = self.bucket_for([[0] * lq])
            self.packer.warm([lq], bk.n_tokens, bk.tile)
        if self.graphs:
            pool, stream = torch.cuda.graph_pool_handle(), capture_stream(self.device)
            for key in sorted(self.buckets, key=lambda k: -self.buckets[k].n_tokens):
                for done in self.buckets[key].capture(pool, stream):
                    yield f"bucket {key[0]}×{key[1]}: {done}"

    def _pick_attention(self, wanted: str) -> tuple[str, list[str]]:
        """'auto' takes the tree kernel wherever it runs (a CUDA device with Triton); on a GPU without it,
        the dense SDPA path runs and says so. An explicit 'tree' that cannot run is refused here."""
        if wanted not in ("auto", "tree", "sdpa"):
            raise ValueError(f"engine.attention must be auto, tree or sdpa, not {wanted!r}")
        why = tree_available(self.device, self.dec.head_dim)
        if wanted == "tree" and why:
            raise ValueError(f"engine.attention=tree cannot run: {why}; use engine.attention=auto or sdpa")
        if wanted == "auto":
            if why is None and self.device.type == "cuda":
                return "tree", []
            if self.device.type == "cuda":
                return "sdpa", [f"tree attention unavailable ({why}): dense masked SDPA runs instead (slower)"]
            return "sdpa", []
        return wanted, []

    def _check_positions(self) -> None:
        if self.reach > self.dec.max_positions:
            raise ValueError(f"a prompt row reaches position {self.reach}, over the model's max_position_embeddings="
                             f"{self.dec.max_positions}: shorten the prompt or the largest query bucket")

    def _check_taps(self) -> None:
        n, stop = len(self.dec.layers), self.dec.stop_after
        if stop is not None:  # the forward ends after `stop` layers: nothing deeper, no final state
            bad = [t.name for t in self.taps if t.layer == FINAL or t.layer > stop]
            if bad:
                raise ValueError(f"hidden-state taps {bad}: the forward stops after layer {stop}, a head here reads "
                                 f"the residual stream after 1…{stop} layers")
            if not self.taps or max(t.layer for t in self.taps) != stop:
                raise ValueError(f"the forward stops after layer {stop}, but no head reads that layer")
            return
        bad = [t.name for t in self.taps if t.layer != FINAL and not 1 <= t.layer < n]
        if bad:
            raise ValueError(f"hidden-state taps {bad}: this model has {n} layers, a head reads the residual stream "
                             f"after 1…{n - 1} layers or the final norm's output ({FINAL})")

    def _fill_prefix_pool(self) -> Iterator[str]:
        """Run each prompt's not-yet-cached prefix blocks through the decoder, writing their K/V into the
        pool slots; earlier blocks (possibly another prompt's) are read where they lie."""
        dev, key_len = self.device, self.pool_len
        key_pos = self.packer.slot_pos.to(dev)  # a pool slot's position in every prefix that holds it
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
            embeds = None
            if self.embed_fn is not None:
                embeds = torch.empty(len(ids), self.dec.embed.embedding_dim, dtype=self.dec.dtype, device=dev)
                self.embed_fn(ids.cpu(), embeds)
            attend = DenseAttention(lambda w: allowed & (pos[:, None] - key_pos[None, :] < w) if w > 0 else allowed,
                                    key_len)
            with torch.inference_mode():
                self.dec.forward(ids, pos, write, attend, torch.tensor([0], device=dev), embeds)
            yield f"prompt {self.prompts[p].tokens.name!r}: prefix fill ({len(ids)} tokens)"

    def bucket_for(self, batch: list[list[int]]) -> Bucket:
        longest, total = max(len(ids) for ids in batch), sum(len(ids) for ids in batch)
        key = next(((len(batch), lt) for lt in token_buckets(self.query_buckets, len(batch)) if lt >= total), None)
        if key is None or longest > self.query_buckets[-1] or len(batch) > self.max_batch:
            raise ValueError(f"batch of {len(batch)} queries, longest {longest} tokens, exceeds the engine's "
                             f"limits (max_batch_size={self.max_batch}, largest query bucket {self.query_buckets[-1]})")
        return self.buckets[key]

    def run(self, batch: list[list[int]]) -> tuple[Scores, Scores, dict[str, float], int, tuple[Scores, Scores]]:
        """Raw and calibrated scores per query per prompt for a batch of query ids (one tail product makes
        both); stage times in ms (prepare, forward, score, and device_wait: from queueing the batch to the
        device starting it); tokens per forward; the softmax of the raw and of the calibrated scores per query per
        prompt (float64, computed on the device)."""
        return self.collect(self.launch(batch))

    @torch.inference_mode()
    def launch(self, batch: list[list[int]]) -> InFlight:
        """Pack the batch and queue its forward, tail and copy back without waiting for the device: with a
        batch already in flight this one runs right after it, so the host's work on either overlaps the
        device's. At most SLOTS batches are in flight; each must be collected."""
        t0 = time.perf_counter()
        bk = self.bucket_for(batch)
        # one launch at a time: the static input buffers take one batch at a time, and a server's fallback
        # may launch from another thread than its launcher
        with self._launching:
            if not self._free:
                raise RuntimeError(f"{SLOTS} batches already in flight: collect one before launching another")
            slot = self._free.pop()
            try:
                return self._queue(bk, batch, slot, t0)
            except BaseException:
                self._free.append(slot)
                raise

    def _queue(self, bk: Bucket, batch: list[list[int]], slot: int, t0: float) -> InFlight:
        bk.pack(batch, slot)
        if self.device.type != "cuda":  # the host computes: nothing to overlap
            bk.load(slot)
            t1 = time.perf_counter()
            bk.forward()
            t2 = time.perf_counter()
            bk.out[slot].copy_(bk.score())
            return InFlight(bk, len(batch), slot, t0, (t1 - t0) * 1e3,
                            host_ms=((t2 - t1) * 1e3, (time.perf_counter() - t2) * 1e3))
        ev, stream = self._events[slot], self._stream
        ev[0].record(stream)
        bk.load(slot)
        bk.graphs[0].replay() if bk.graphs else bk.forward()
        ev[1].record(stream)
        bk.graphs[1].replay() if bk.graphs else bk.score()
        bk.out[slot].copy_(bk.scores, non_blocking=True)
        ev[2].record(stream)
        return InFlight(bk, len(batch), slot, t0, (time.perf_counter() - t0) * 1e3, ev)

    @staticmethod
    def done(job: InFlight) -> bool:
        """Whether a launched batch's scores are on the host (collect would not wait); never blocks."""
        return job.events is None or job.events[2].query()

    def collect(self, job: InFlight) -> tuple[Scores, Scores, dict[str, float], int, tuple[Scores, Scores]]:
        """Wait for a launched batch and read its scores (see `run`)."""
        bk = job.bucket
        try:
            if job.events is not None:
                job.events[2].synchronize()  # releases the GIL while the device works
                done = time.perf_counter()
                fwd, score = job.events[0].elapsed_time(job.events[1]), job.events[1].elapsed_time(job.events[2])
            else:
                done, (fwd, score) = time.perf_counter(), job.host_ms
            flat = bk.out[job.slot].tolist()
        finally:
            self._free.append(job.slot)
        raw, cal, raw_p, cal_p = split_blocks(flat, job.batch_size, bk.tail.label_counts)
        score += (time.perf_counter() - done) * 1e3
        # device time is measured by events, host time by the clock; what is left of the wall time is the wait
        # for the device (a batch ahead of this one, the launch latency)
        wait = max(0.0, (time.perf_counter() - job.started) * 1e3 - job.prepare_ms - fwd - score)
        return (raw, cal, {"prepare": job.prepare_ms, "forward": fwd, "score": score, "device_wait": wait}, bk.n_tokens,
                (raw_p, cal_p))

    def states(self, job: InFlight) -> torch.Tensor:
        """[taps, rows, H] (rows = query-major × prompt) of a collected batch, on the host; read it before the
        next batch of the same size is launched. For fitting heads (`taps`), not for the request path."""
        if job.bucket.taps is None:
            raise ValueError("this engine keeps no hidden states: build it with taps")
        return job.bucket.taps.states()[:, :job.batch_size * len(self.prompts)]

    def stats(self) -> EngineStats:
        return EngineStats(self.pool.stats(), [(k[0], k[1], b.n_tokens) for k, b in sorted(self.buckets.items())],
                           self.graphs, self.attention, self.dec.kv_bytes)
