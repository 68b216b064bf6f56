"""The bounded key → result map that makes repeated queries free: `qcls bulk`'s dedupe across chunks and a
`Classifier`'s (and so a serving replica's) answers to queries it has seen.

At most `size` entries (least recently seen evicted first). The map changes only in `absorb`; `get` changes
nothing. For `qcls bulk` that matters: the map changes once per chunk, from the chunk's finished rows in input
order, so its state after chunk k is a function of the rows of chunks 0…k alone, and a resumed run rebuilds it
exactly by absorbing the parts already written (a query's probabilities can differ in the last bits with the
batch it ran in, so a resumed run must put the same queries in the same batches to write the same bytes).

A `Classifier` keys its results by (configuration fingerprint, query) (`lookup`/`remember` below): a hit is a
copy of the stored result marked `meta["cache"] = "hit"`, with its own timings and `batch_size` 0 (no forward).
Only classified queries are kept (a refusal or an engine failure is never answered from the cache).
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import replace
from typing import TYPE_CHECKING, Hashable, Iterable

if TYPE_CHECKING:
    from qcls.results import QueryResult


class ResultCache:
    def __init__(self, size: int):
        if size < 0:
            raise ValueError(f"cache size must be ≥ 0, got {size}")
        self.size = size
        self._map: OrderedDict[Hashable, object] = OrderedDict()
        self.evicted = 0
        self.hits = 0  # counted by `lookup` (bulk counts its own rows)
        self.misses = 0

    def __len__(self) -> int:
        return len(self._map)

    def get(self, key: Hashable):
        """The cached result or None; looking up changes nothing (see the module docstring)."""
        return self._map.get(key)

    def absorb(self, pairs: Iterable[tuple[Hashable, object]]) -> int:
        """(key, result) pairs, in order: each becomes the most recently seen. Returns how many were evicted."""
        if self.size == 0:
            return 0
        m, before = self._map, self.evicted
        for k, r in pairs:
            if k in m:
                m.move_to_end(k)
            else:
                m[k] = r
                if len(m) > self.size:
                    m.popitem(last=False)
                    self.evicted += 1
        return self.evicted - before

    def clear(self) -> None:
        self._map.clear()

    def stats(self) -> dict[str, int]:
        return {"entries": len(self._map), "size": self.size, "hits": self.hits, "misses": self.misses,
                "evictions": self.evicted}

    # -- a Classifier's results ------------------------------------------------------------------------------

    def lookup(self, fingerprint: str, queries: list[str]) -> list["QueryResult | None"]:
        """Per query: a hit (a fresh copy of the stored result, marked and timed as such) or None. A hit counts
        as seen (it is absorbed again), so the map keeps the queries in use."""
        if self.size == 0:
            return [None] * len(queries)
        out: list[QueryResult | None] = []
        seen = []
        for q in queries:
            t0 = time.perf_counter()
            stored = self._map.get((fingerprint, q))
            if stored is None:
                self.misses += 1
                out.append(None)
                continue
            self.hits += 1
            ms = round((time.perf_counter() - t0) * 1e3, 4)
            out.append(replace(stored, batch_size=0, timings_ms={"cache": ms, "total": ms},
                               meta={**stored.meta, "cache": "hit"}))
            seen.append(((fingerprint, q), stored))
        self.absorb(seen)
        return out

    def remember(self, fingerprint: str, results: Iterable["QueryResult"]) -> int:
        """Keep the classified results of this configuration (meta["fingerprint"] == fingerprint) and mark them
        `meta["cache"] = "miss"`; results of another configuration (a batch finished across a reload) are left
        out. Returns how many entries were evicted."""
        if self.size == 0:
            return 0
        keep = []
        for r in results:
            if r.error is None and r.prompts and r.meta.get("fingerprint") == fingerprint \
                    and r.meta.get("cache") != "hit":
                r.meta["cache"] = "miss"
                keep.append(((fingerprint, r.query), r))
        return self.absorb(keep)
