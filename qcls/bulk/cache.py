"""The query → result map that makes repeats free, bounded so tens of millions of distinct queries fit.

At most `size` entries (least recently seen evicted first). The map changes only in `absorb`, once per
chunk, from the chunk's finished rows in input order: so its state after chunk k is a function of the rows of
chunks 0…k alone, and a resumed run rebuilds it exactly by absorbing the parts already written. That matters
because a query's probabilities can differ in the last bits with the batch it ran in (another bucket's
kernels): a resumed run must put the same queries in the same batches to write the same bytes.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Hashable, Iterable


class ResultCache:
    def __init__(self, size: int):
        if size < 0:
            raise ValueError(f"cache size must be ≥ 0, got {size}")
        self.size = size
        self._map: OrderedDict[Hashable, object] = OrderedDict()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._map)

    def get(self, query: str):
        """The cached result or None; looking up changes nothing (see the module docstring)."""
        return self._map.get(query)

    def absorb(self, pairs: Iterable[tuple[str, object]]) -> None:
        """(query, result) of a finished chunk's classified rows, in input order."""
        if self.size == 0:
            return
        m = self._map
        for q, r in pairs:
            if q in m:
                m.move_to_end(q)
            else:
                m[q] = r
                if len(m) > self.size:
                    m.popitem(last=False)
                    self.evicted += 1
