"""EngineWorker without Ray: per-query isolation of engine errors and the health probe's rules."""
from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from qcls.deployments.worker import INTERNAL_ERROR, EngineWorker, Pending, error_kind
from qcls.results import LabelScore, PromptResult, QueryResult


class FakeTokenizer:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


class FakeClassifier:
    """Classifies by query length; raises for queries in `poison`, or for everything once `dead`."""

    def __init__(self):
        self.tokenizer = FakeTokenizer()
        self.cfg = SimpleNamespace(max_query_tokens=8, engine=SimpleNamespace(max_batch_size=4))
        self.poison, self.dead, self.calls, self.delay = set(), False, [], 0.0

    def classify(self, queries):
        self.calls.append(list(queries))
        time.sleep(self.delay)
        if self.dead or self.poison & set(queries):
            raise RuntimeError("CUDA error: boom")
        return [QueryResult(q, [PromptResult("p", "a", 1.0, [LabelScore("a", 0.0, 1.0, 1)])], None, len(q),
                            len(queries), {"total": 1.0}) for q in queries]


def run(coro):
    return asyncio.run(coro)


def test_refusals_name_the_problem():
    w = EngineWorker(FakeClassifier())
    assert w.refusal("ok") is None
    assert "empty query" in w.refusal("  ")
    assert "max_query_tokens=8" in w.refusal("x" * 9)
    assert "must be a string" in w.refusal(3)


def test_poisoned_query_fails_alone_and_the_probe_clears_suspicion():
    clf = FakeClassifier()
    clf.poison = {"bad"}
    w = EngineWorker(clf)
    out = run(w.run_batch([Pending(q, 0.0) for q in ["a", "bad", "c"]]))
    assert [r.ok for r in out] == [True, False, True]
    assert error_kind(out[1]) == INTERNAL_ERROR and "CUDA error" in out[1].error
    assert clf.calls == [["a", "bad", "c"], ["a"], ["bad"], ["c"]]
    assert all("queue_wait" in r.timings_ms for r in out)
    assert w.suspect is not None
    run(w.check())  # a real forward answers: healthy again
    assert w.suspect is None and w.broken is None


def test_dead_engine_fails_the_probe_and_stays_unhealthy():
    clf = FakeClassifier()
    w = EngineWorker(clf)
    run(w.check())  # no error and not idle: no probe at all
    assert clf.calls == []
    clf.dead = True
    out = run(w.run_batch([Pending("a", 0.0)]))
    assert not out[0].ok
    with pytest.raises(RuntimeError, match="engine unusable"):
        run(w.check())
    clf.dead = False
    with pytest.raises(RuntimeError, match="engine unusable"):  # a replica that broke is replaced, not trusted
        run(w.check())
    assert "engine unusable" in run(w.run_batch([Pending("a", 0.0)]))[0].error


def test_queries_arriving_during_a_forward_share_the_next_one():
    clf = FakeClassifier()
    clf.delay = 0.2
    w = EngineWorker(clf)

    async def scenario():
        first = w.submit([Pending("a", time.perf_counter())])
        await asyncio.sleep(0.05)  # "a" is on the device now; five single-query batches arrive meanwhile
        later = [w.submit([Pending(q, time.perf_counter())]) for q in "bcdef"]
        return await asyncio.gather(*first, *(f for fs in later for f in fs))

    out = run(scenario())
    assert clf.calls == [["a"], ["b", "c", "d", "e"], ["f"]]  # at most engine.max_batch_size per forward
    assert [r.query for r in out] == list("abcdef") and [r.batch_size for r in out] == [1, 4, 4, 4, 4, 1]
    assert out[1].timings_ms["queue_wait"] >= 100  # waited for the forward ahead


def test_idle_engine_is_probed():
    clf = FakeClassifier()
    w = EngineWorker(clf, probe_idle_s=0.0)
    run(w.check())
    assert len(clf.calls) == 1
