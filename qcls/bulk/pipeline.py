"""Distinct queries through one Classifier at the engine's rate, while the host builds the output.

`Feed` keeps the device busy without ever making its caller wait: queries go in as the rows that bring them
are read, full batches of engine.max_batch_size are queued with two in flight (`Classifier.start` queues a
batch's forward behind the running one), and a finished batch is collected only once the device is done with
it (`Classifier.done`). `process_chunk` runs one chunk of rows through it slice by slice: between slices it
feeds the device, and it builds the records of the slices whose queries are answered while the device works on
later ones. So the device waits for the host only at a chunk's end (its last, partial batch), not while a whole
chunk is read nor while its records are built.

A chunk's batches are the ones a one-shot run over its distinct new queries would make (full batches in order
of first appearance, the remainder last), whatever the slicing: a resumed run puts the same queries in the
same batches and writes the same bytes (qcls/results/cache.py says why that matters). Shared by the
single-process runner and the Ray Data actors.
"""
from __future__ import annotations

import gc
import logging
from collections import deque
from typing import Callable, Iterator

from qcls.results.cache import ResultCache
from qcls.bulk.outputs import Columns, Result
from qcls.bulk.progress import Tally
from qcls.query_files import Row
from qcls.results import QueryResult
from qcls.results.requests import error_kind, finish_batch, start_batch

log = logging.getLogger("qcls.bulk")

# rows handed over at a time: the device is fed between slices, so a slice's host work (its dedupe, or building
# its records) stays well under one batch's device time (≈ 8 ms at batch 4 on an H100); 256 rows take a few ms
# on a slow 2-core machine
SLICE_ROWS = 256


class Feed:
    """Queries in, results out, in order; two batches in flight. `add` and `pump` never wait for the device;
    `wait` does, for the oldest batch."""

    def __init__(self, clf):
        self.clf = clf
        self.step = clf.cfg.engine.max_batch_size
        self.todo: deque[str] = deque()
        self.inflight: deque[tuple[list[str], object]] = deque()
        self.results: dict[str, QueryResult] = {}
        self.added = self.answered = 0  # queries so far: a slice is answered once `answered` reaches its mark
        self.flushing = False  # the queries added so far may go in a partial last batch

    def add(self, queries: list[str]) -> int:
        """Queue queries; returns the mark `answered` reaches once all of them are answered. They take the request
        path's first step as every caller's do (`Classifier.open`): a refused query is answered here, with no
        batch slot. (No result cache there: `process_chunk` hands over only queries its own map has not answered.)"""
        req = self.clf.open(queries)
        self.results.update((q, r) for q, r in zip(req.queries, req.results) if r is not None)
        self.todo.extend(req.todo)
        self.added += len(queries)
        self.answered += len(queries) - len(req.todo)
        self.flushing = False
        self.pump()
        return self.added

    def flush(self) -> None:
        """No more queries until all of these are answered: the remainder may go as a partial batch."""
        self.flushing = True
        self.pump()

    def pump(self) -> None:
        """Collect the batches the device has finished, then queue full batches (after `flush`, the partial
        remainder too) until two are in flight."""
        while self.inflight and _done(self.clf, self.inflight[0][1]):
            self._collect()
        while len(self.inflight) < 2 and (len(self.todo) >= self.step or (self.flushing and self.todo)):
            chunk = [self.todo.popleft() for _ in range(min(self.step, len(self.todo)))]
            self.inflight.append((chunk, start_batch(self.clf, chunk)))

    def wait(self) -> None:
        """Collect the oldest batch in flight, waiting for the device if it is not done; queue what fits."""
        if self.inflight:
            self._collect()
        self.pump()

    def _collect(self) -> None:
        chunk, batch = self.inflight.popleft()
        for q, r in zip(chunk, finish_batch(self.clf, chunk, batch)):
            self.results[q] = r
        self.answered += len(chunk)


def process_chunk(feed: Feed, slices: Iterator[list[Row]] | list[list[Row]], cols: Columns, cache: ResultCache,
                  tally: Tally, prompts: list[str], next_slice: Callable[[bool], list[Row] | None] | None = None,
                  tick: Callable[[], None] | None = None) -> tuple[list[dict], list[tuple[str, Result]]]:
    """Records of one chunk and its (query, result) pairs for the cache, in input order; every distinct query
    of the chunk not in the cache is classified once. The chunk's rows come as `slices` (a list or iterator),
    or from `next_slice(block)`: a slice, [] when none is ready yet (block=False), None at the chunk's end.
    `tally` counts as the slices are written; `tick()` after each (the progress line)."""
    if next_slice is None:
        it = iter(slices)
        next_slice = lambda block: next(it, None)  # noqa: E731
    fresh = feed.results
    seen: set[str] = set()
    waiting: deque[tuple[list[Row], int]] = deque()  # slices read, not yet written, with their feed marks
    records: list[dict] = []
    pairs: list[tuple[str, Result]] = []
    converted: dict[str, Result] = {}  # the chunk's classified queries, as the output shows them
    ended = False
    while not ended or waiting:
        if waiting and feed.answered >= waiting[0][1]:  # answered: its records, while the device works on
            rows = waiting.popleft()[0]                 # what was fed after it
            _build(rows, cols, cache, fresh, converted, tally, prompts, records, pairs)
            # Python's full collections scan every live object, and a chunk keeps tens of thousands of rows and
            # records alive: unfrozen, they stalled the device for 0.2-0.5 s at a time (~5 % of a run). Frozen
            # objects are still freed by reference counting; only cyclic garbage waits for `gc.unfreeze()`
            # (the single-process run calls it at its end; a Ray actor keeps its objects frozen for its life, its
            # cache above all; rows, records and results hold no cycles).
            gc.freeze()
            if tick is not None:
                tick()
        elif not ended:
            rows = next_slice(not feed.inflight)
            if rows is None:
                ended = True
                feed.flush()  # the chunk's remainder: a partial batch
            elif rows:
                new = [q for q in (r.query for r in rows)
                       if q is not None and q not in seen and not seen.add(q) and cache.get(q) is None]
                waiting.append((rows, feed.add(new)))
                continue
            else:  # nothing read yet (next_slice blocks only while the device has nothing of ours)
                feed.wait()
        else:
            feed.wait()
        feed.pump()
    tally.cached += len(pairs) - len(converted)
    fresh.clear()
    return records, pairs


def _build(rows: list[Row], cols: Columns, cache: ResultCache, fresh: dict[str, QueryResult],
           converted: dict[str, Result], tally: Tally, prompts: list[str], records: list[dict],
           pairs: list[tuple[str, Result]]) -> None:
    for r in rows:
        result, error = None, r.error
        q = r.query
        if q is not None:
            qr = fresh.get(q)
            if qr is None:
                result = cache.get(q)
            elif qr.ok:
                result = converted.get(q)
                if result is None:  # the query's first row: it counts as classified
                    result = converted[q] = cols.result_of(qr)
                    tally.classified += 1
            else:
                error = qr.error
            if result is not None:
                pairs.append((q, result))
        records.append(cols.record(r.values, result, error))
        count(tally, result, error, prompts)


def count(tally: Tally, result: Result | None, error: str | None, prompts: list[str]) -> None:
    """One output row in the counts (a resumed run counts its part files' rows the same way)."""
    tally.rows += 1
    if error:
        tally.errors[error_kind(error)] += 1
    elif result is not None:
        tally.count_result(prompts, result[0])


def _done(clf, batch) -> bool:
    return isinstance(batch, BaseException) or clf.done(batch)  # a start that raised left nothing on the device
