"""Hidden states kept from the forward for learned heads (design.md §10), one vector per (query, prompt) row.

A tap is the residual stream after `layer` decoder layers, or the final norm's output, at the row's read
position (the trie root: the last suffix token) or averaged over the row's query tokens. All taps of one
batch size live in one static float32 buffer [taps, rows + 2, H] that the forward writes (inside the CUDA
graph) and the tail reads:

    row r = query · P + prompt,   row R = sink (non-query tokens of a query mean land there),
    row R + 1 = zeros (what a head's padding columns read)

Which rows a token belongs to comes from the per-request descriptors (`read`, `qrow`), so nothing here is
built on the request path.
"""
from __future__ import annotations

import torch

from qcls.heads.head import FINAL, Tap


class TapPlan:
    """The taps of one batch size b: buffers and the row → read index table, built at start-up."""

    def __init__(self, taps: list[Tap], b: int, root_reads: list[int], hidden: int, device: torch.device):
        """`root_reads`: per row (query-major, then prompt) the index of its root in the read rows."""
        self.taps = list(taps)
        self.rows = len(root_reads)
        self.buf = torch.zeros(len(taps), self.rows + 2, hidden, dtype=torch.float32, device=device)
        self.root_reads = torch.tensor(root_reads, dtype=torch.long, device=device)
        self.layers: dict[int, list[int]] = {}
        for i, t in enumerate(self.taps):
            if t.layer != FINAL:
                self.layers.setdefault(t.layer, []).append(i)
        self.final = [i for i, t in enumerate(self.taps) if t.layer == FINAL]

    def bind(self, read: torch.Tensor, qrow: torch.Tensor) -> "TapSink":
        """What one forward needs to record its taps: token index of each row's root, and each token's query
        row (the sink for tokens that are not query tokens)."""
        return TapSink(self, read.index_select(0, self.root_reads), torch.where(qrow < 0, self.rows, qrow))

    def record_final(self, h_read: torch.Tensor) -> None:
        for i in self.final:
            self.buf[i, :self.rows].copy_(h_read.index_select(0, self.root_reads))

    def states(self) -> torch.Tensor:
        """[taps, rows, H] of the last forward (a copy on the host; for fitting, not the request path)."""
        return self.buf[:, :self.rows].to("cpu", torch.float32, copy=True)  # never a view: the next forward writes buf


class TapSink:
    """One forward's view of a TapPlan: `record(layer, residual)` is called by the decoder after each layer."""

    def __init__(self, plan: TapPlan, root_tokens: torch.Tensor, qrow: torch.Tensor):
        self.plan, self.root_tokens, self.qrow = plan, root_tokens, qrow
        self.layers = plan.layers

    def record(self, layer: int, residual: torch.Tensor) -> None:
        p = self.plan
        for i in p.layers[layer]:
            if p.taps[i].kind == "position":
                p.buf[i, :p.rows].copy_(residual.index_select(0, self.root_tokens))
                continue
            acc = p.buf[i, :p.rows + 1]
            acc.zero_()
            acc.index_add_(0, self.qrow, residual.float())
            count = torch.zeros(p.rows + 1, dtype=torch.float32, device=acc.device)
            count.index_add_(0, self.qrow, torch.ones_like(self.qrow, dtype=torch.float32))
            acc.div_(count.clamp_min(1.0)[:, None])


def root_reads(read_counts: list[int], b: int) -> list[int]:
    """Index of each (query, prompt) row's root read, given every prompt's number of reads (root first)."""
    out, off = [], 0
    for _ in range(b):
        for n in read_counts:
            out.append(off)
            off += n
    return out
