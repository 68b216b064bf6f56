"""Hidden states kept from the forward for learned heads (docs/design.md §10), one vector per (query, prompt) row.

A tap is the residual stream after `layer` decoder layers, or the final norm's output, at the row's read
position (the trie root: the last suffix token) or averaged over the row's query tokens. All taps of one
batch size live in one static float32 buffer [taps, rows + 2, H] that the forward writes (inside the CUDA
graph) and the tail reads:

    row r = query · P + prompt,   rows R and R + 1 = zeros (what a head's padding columns read)

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
        self.row_ids = torch.arange(self.rows, device=device)
        self.layers: dict[int, list[int]] = {}
        for i, t in enumerate(self.taps):
            if t.layer != FINAL:
                self.layers.setdefault(t.layer, []).append(i)
        self.final = [i for i, t in enumerate(self.taps) if t.layer == FINAL]

    def bind(self, read: torch.Tensor, qrow: torch.Tensor) -> "TapSink":
        """What one forward needs to record its taps: token index of each row's root and, when a query mean is
        read, the [rows, tokens] averaging matrix of the rows' query tokens (a product, not atomic adds: many
        tokens land on few rows)."""
        mean = None
        if any(self.taps[i].kind == "query_mean" for ids in self.layers.values() for i in ids):
            mean = (qrow[None, :] == self.row_ids[:, None]).float()
            mean /= mean.sum(1, keepdim=True).clamp_min(1.0)
        return TapSink(self, read.index_select(0, self.root_reads), mean)

    def record_final(self, h_read: torch.Tensor) -> None:
        for i in self.final:
            torch.index_select(h_read.float(), 0, self.root_reads, out=self.buf[i, :self.rows])

    def states(self) -> torch.Tensor:
        """[taps, rows, H] of the last forward (a copy on the host; for fitting, not the request path)."""
        return self.buf[:, :self.rows].to("cpu", torch.float32, copy=True)  # never a view: the next forward writes buf


class TapSink:
    """One forward's view of a TapPlan: `record(layer, residual)` is called by the decoder after each layer."""

    def __init__(self, plan: TapPlan, root_tokens: torch.Tensor, mean: torch.Tensor | None):
        self.plan, self.root_tokens, self.mean = plan, root_tokens, mean
        self.layers = plan.layers

    def reads_position_only(self, layer: int) -> bool:
        """Every tap of `layer` reads the read position (none averages the query's tokens)."""
        return all(self.plan.taps[i].kind == "position" for i in self.layers.get(layer, []))

    def record(self, layer: int, residual: torch.Tensor, rows_read: bool = False) -> None:
        """`residual`: every token's [N, H], or with `rows_read` the read rows' only (in read order)."""
        p = self.plan
        res = residual.float()  # the residual stream is float32 already (kernels.py); a no-op then
        where = p.root_reads if rows_read else self.root_tokens
        for i in p.layers[layer]:
            if p.taps[i].kind == "position":
                torch.index_select(res, 0, where, out=p.buf[i, :p.rows])
            else:
                torch.mm(self.mean, res, out=p.buf[i, :p.rows])


def root_reads(read_counts: list[int], b: int) -> list[int]:
    """Index of each (query, prompt) row's root read, given every prompt's number of reads (root first)."""
    out, off = [], 0
    for _ in range(b):
        for n in read_counts:
            out.append(off)
            off += n
    return out
