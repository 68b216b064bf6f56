"""The bounded cache: least recently seen evicted, lookups change nothing, the state a function of what was
absorbed (so absorbing written parts rebuilds it)."""
from __future__ import annotations

from qcls.bulk.cache import ResultCache


def test_eviction_order_and_pure_lookups():
    c = ResultCache(2)
    c.absorb([("a", 1), ("b", 2)])
    assert c.get("a") == 1  # a lookup does not refresh "a"
    c.absorb([("c", 3)])
    assert (c.get("a"), c.get("b"), c.get("c"), c.evicted) == (None, 2, 3, 1)
    c.absorb([("b", 2), ("d", 4)])  # "b" seen again: "c" is now the oldest
    assert (c.get("b"), c.get("c"), c.get("d"), len(c)) == (2, None, 4, 2)


def test_same_absorbs_same_state():
    chunks = [[("q%d" % (i * 7 % 11), i) for i in range(j, j + 5)] for j in range(0, 30, 5)]
    a, b = ResultCache(4), ResultCache(4)
    for ch in chunks:
        a.absorb(ch)
    for ch in chunks:
        b.absorb(list(ch))
    assert list(a._map.items()) == list(b._map.items())


def test_size_zero_keeps_nothing():
    c = ResultCache(0)
    c.absorb([("a", 1)])
    assert c.get("a") is None and len(c) == 0
