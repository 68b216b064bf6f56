"""One bucket of the fast engine (qcls/engine/engine.py): the static buffers of a (batch size, total query tokens)
shape, the computation over them (decoder forward, then the tail), and its capture as two CUDA graphs. The engine
builds every bucket at start-up; a request packs into one and replays its graphs."""
from __future__ import annotations

from typing import Iterator

import torch

from qcls.engine.attention import DenseAttention, TreeAttention
from qcls.engine.decoder import Decoder
from qcls.engine.layout import Packer, build_mask, unpack
from qcls.engine.probs import Probabilities
from qcls.engine.tail import Tail
from qcls.engine.taps import TapPlan
from qcls.engine.tree_plan import plan_tree, tuning_for

# Batches that may be in flight at once: one on the device while the next is packed and queued behind it.
SLOTS = 2


class Bucket:
    """Static buffers of one (b, L) bucket and the computation over them (captured as is on a GPU)."""

    def __init__(self, b: int, query_tokens: int, packer: Packer, dec: Decoder, tail: Tail, pool_len: int,
                 embed_fn, tree: bool, taps: TapPlan | None = None):
        dev = dec.device
        self.b, self.query_tokens = b, query_tokens
        self.n_tokens = n = packer.n_tokens(b, query_tokens)
        self.key_len = pool_len + n + (-(pool_len + n)) % 16  # mem-efficient SDPA wants aligned mask rows
        self.packer, self.dec, self.tail, self.pool_len, self.embed_fn = packer, dec, tail, pool_len, embed_fn
        self.n_reads = packer.n_reads(b)
        self.taps = taps  # shared by the buckets of batch size b: a forward writes it, its own tail reads it
        # the tree kernels' work lists: fixed by the prompts and the bucket's shape
        group = dec.n_heads // dec.n_kv
        self.tree = plan_tree(packer, b, query_tokens, group, tuning_for(dec.head_dim, group, dev), dec.n_kv).to(dev) \
            if tree else None
        self.tile = self.tree.tuning.row_tile if self.tree is not None else packer.tiles[0]  # the plan's tiles
        self.slots = torch.arange(pool_len, pool_len + n, device=dev)  # where this forward's K/V go
        size, pinned = packer.buffer_len(b, n), dev.type == "cuda"
        # One host buffer per in-flight slot (SLOTS): a batch is packed, and its scores land, while the batch
        # before it may still be on the device, whose asynchronous copies read and write the other slot.
        self.host = [torch.zeros(size, dtype=torch.long, pin_memory=pinned) for _ in range(SLOTS)]
        self.host_np = [h.numpy() for h in self.host]  # what pack writes (a view each: made once, not per request)
        self.probs = Probabilities(tail.label_counts, b, dev)  # the scores and their softmax: what comes back
        self.out = [torch.zeros(self.probs.out.shape[0], dtype=torch.float64, pin_memory=pinned) for _ in range(SLOTS)]
        self.buf = torch.zeros(size, dtype=torch.long, device=dev)
        self.visible, self.slot_pos = packer.visible.to(dev), packer.slot_pos.to(dev)
        self.embeds = None
        if embed_fn is not None:  # the backend gathers embeddings itself (table off the device)
            self.embeds = torch.zeros(n, dec.embed.embedding_dim, dtype=dec.dtype, device=dev)
        self.hidden = self.scores = None
        self.graphs: tuple[torch.cuda.CUDAGraph, torch.cuda.CUDAGraph] | None = None

    def forward(self) -> torch.Tensor:
        d = unpack(self.buf, self.n_tokens, self.n_reads, len(self.packer.prompts))
        if self.tree is not None:
            attend = TreeAttention(d, self.tree, self.pool_len, self.dec.n_heads, self.dec.head_dim, self.dec.dtype)
        else:
            attend = DenseAttention(lambda w: build_mask(d, self.visible, self.key_len, w, self.slot_pos), self.key_len)
        sink = self.taps.bind(d["read"], d["qrow"]) if self.taps is not None else None
        self.hidden = self.dec.forward(d["ids"], d["pos"], self.slots, attend, d["read"], self.embeds, sink)
        if self.taps is not None:
            self.taps.record_final(self.hidden)
        return self.hidden

    def score(self) -> torch.Tensor:
        self.scores = self.probs(self.tail(self.hidden, self.taps.buf if self.taps is not None else None))
        return self.scores

    def pack(self, batch: list[list[int]], slot: int) -> None:
        self.packer.pack(batch, self.n_tokens, self.host_np[slot], self.tile)

    def load(self, slot: int) -> None:
        """Copy the packed slot into the static input buffers; stream-ordered after any forward before it."""
        self.buf.copy_(self.host[slot], non_blocking=True)
        if self.embed_fn is not None:
            self.embed_fn(self.host[slot][:self.n_tokens], self.embeds)

    def capture(self, pool, stream: torch.cuda.Stream) -> Iterator[str]:
        """Warm up, then capture the forward and the tail, on `stream` (engine.capture_stream: cuBLAS keeps a
        workspace per stream, allocated by the warm-up, never inside a capture): four steps, one per `next()`,
        each yielding what it did and ending with nothing of the build left running. Not torch.cuda.graph: it
        synchronizes the whole device and empties both memory caches before every capture, which beside another
        engine's live forwards can deadlock (measured on H200s: the capture's device synchronize against a serving
        collector's event wait)."""
        current = torch.cuda.current_stream(self.dec.device)
        stream.wait_stream(current)
        for k in (1, 2):  # two warm-up runs, a step each (an eager forward is most of a step's time)
            with torch.inference_mode(), torch.cuda.stream(stream):
                self.forward()
                self.score()
            stream.synchronize()  # the build's kernels end with the step (this stream only, not the device)
            yield f"warm-up {k} of 2 before capture"
        graphs = []
        for name, step in (("forward", self.forward), ("tail", self.score)):
            graph = torch.cuda.CUDAGraph()
            with torch.inference_mode(), torch.cuda.stream(stream):
                # thread_local: a capture's errors are this thread's own; other threads' calls are not checked
                graph.capture_begin(pool=pool, capture_error_mode="thread_local")
                try:
                    step()
                except BaseException:
                    try:  # end the capture, but report what broke it (an out-of-memory, say), not the invalidation
                        graph.capture_end()
                    except Exception:  # noqa: BLE001
                        pass
                    raise
                graph.capture_end()
            graphs.append(graph)
            if len(graphs) == 2:
                current.wait_stream(stream)
                self.graphs = (graphs[0], graphs[1])
            yield f"{name} graph captured"


def token_buckets(query_buckets: list[int], b: int) -> list[int]:
    """Buckets of the batch's total query tokens: the per-query buckets, then ×1.5 steps up to b × the
    largest (a batch of b queries never holds fewer than b tokens)."""
    top = b * query_buckets[-1]
    out = list(query_buckets)
    while out[-1] < top:
        out.append(min(top, out[-1] * 3 // 2))
    return [x for x in out if x >= b]
