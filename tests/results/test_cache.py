"""The bounded cache: least recently seen evicted, lookups change nothing, the state a function of what was
absorbed (so absorbing written parts rebuilds it)."""
from __future__ import annotations

import pytest

from qcls.results.cache import ResultCache


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


def _result(query: str, fingerprint: str = "fp1", ok: bool = True):
    from qcls.results import LabelScore, PromptResult, QueryResult
    if not ok:
        return QueryResult(query=query, error="empty query")
    prompts = [PromptResult("category", "dress", 0.75, [LabelScore("dress", -0.3, 0.75, 1),
                                                        LabelScore("jeans", -1.4, 0.25, 1)])]
    return QueryResult(query=query, prompts=prompts, query_tokens=2, batch_size=3,
                       timings_ms={"forward": 5.0, "total": 6.0}, meta={"fingerprint": fingerprint})


def test_a_classifiers_results_are_kept_per_configuration_and_hits_are_marked_copies():
    c = ResultCache(10)
    c.remember("fp1", [_result("maxi dress"), _result("", ok=False), _result("old", fingerprint="fp0")])
    assert len(c) == 1  # neither a refusal nor another configuration's answer is kept
    hit, miss = c.lookup("fp1", ["maxi dress", "slim jeans"])
    assert miss is None and hit.meta == {"fingerprint": "fp1", "cache": "hit"}
    assert hit.batch_size == 0 and set(hit.timings_ms) == {"cache", "total"}
    assert hit.prompts[0].prob == 0.75 and hit.prompts[0].labels[1].prob == 0.25
    hit.timings_ms["queue_wait"] = 1.0  # a caller's additions stay in its copy
    assert "queue_wait" not in c.lookup("fp1", ["maxi dress"])[0].timings_ms
    assert c.lookup("fp2", ["maxi dress"]) == [None]  # another configuration's key
    assert c.stats() == {"entries": 1, "size": 10, "hits": 2, "misses": 2, "evictions": 0}
    c.clear()
    assert c.lookup("fp1", ["maxi dress"]) == [None] and len(c) == 0


def test_hits_count_as_use_for_eviction():
    c = ResultCache(2)
    c.remember("fp1", [_result("a"), _result("b")])
    c.lookup("fp1", ["a"])  # "a" used: "b" is now the least recently seen
    assert c.remember("fp1", [_result("c")]) == 1
    assert [r is not None for r in c.lookup("fp1", ["a", "b", "c"])] == [True, False, True]


def test_a_disabled_cache_answers_nothing():
    c = ResultCache(0)
    assert c.remember("fp1", [_result("a")]) == 0 and c.lookup("fp1", ["a"]) == [None] and c.misses == 0


@pytest.mark.slow
def test_classifier_answers_a_repeated_query_from_its_cache_only_when_asked(demo_classifier):
    clf = demo_classifier
    clf.cache.clear()
    first = clf.classify(["maxi dress", "boys tee"], cache=True)
    again = clf.classify(["boys tee", "slim jeans men"], cache=True)
    assert [r.meta["cache"] for r in first] == ["miss", "miss"]
    assert [r.meta["cache"] for r in again] == ["hit", "miss"]
    hit = again[0]
    assert hit.batch_size == 0 and hit.meta["fingerprint"] == clf.fingerprint == first[1].meta["fingerprint"]
    assert [[lab.prob for lab in p.labels] for p in hit.prompts] == [[lab.prob for lab in p.labels]
                                                                     for p in first[1].prompts]
    plain = clf.classify(["boys tee"])[0]  # the default: a forward, as benchmarks and evaluation need
    assert plain.batch_size == 1 and "cache" not in plain.meta
    assert clf.metadata()["result_cache"]["hits"] >= 1
