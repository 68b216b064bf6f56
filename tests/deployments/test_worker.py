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
    """A device that runs one batch at a time for `delay` seconds: `start` queues a batch behind those before
    it and returns at once, `finish` waits for it. Raises for queries in `poison`, or for everything once
    `dead`. `log` records every start and finish in order."""

    def __init__(self):
        self.tokenizer = FakeTokenizer()
        self.cfg = SimpleNamespace(max_query_tokens=8, engine=SimpleNamespace(max_batch_size=4))
        self.poison, self.dead, self.calls, self.delay = set(), False, [], 0.0
        self.log: list[tuple[str, tuple[str, ...]]] = []
        self.device_ms: dict[int, float] = {}  # what Classifier measures at start-up
        self._device_free_at = 0.0

    def start(self, queries):
        self.calls.append(list(queries))
        self.log.append(("start", tuple(queries)))
        if self.dead or self.poison & set(queries):
            raise RuntimeError("CUDA error: boom")
        now = time.perf_counter()
        begin = max(now, self._device_free_at)
        self._device_free_at = begin + self.delay
        return list(queries), begin - now, self._device_free_at

    def finish(self, batch, wait_is_queue=False):
        queries, waited, done = batch
        time.sleep(max(0.0, done - time.perf_counter()))
        self.log.append(("finish", tuple(queries)))
        extra = {"device_wait": waited * 1e3} if wait_is_queue else {}
        return [QueryResult(q, [PromptResult("p", "a", 1.0, [LabelScore("a", 0.0, 1.0, 1)])], None, len(q),
                            len(queries), {"forward": self.delay * 1e3, "score": 0.0, "total": 1.0, **extra})
                for q in queries]

    def classify(self, queries):
        return self.finish(self.start(queries))


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


@pytest.mark.parametrize("depth", [1, 2])
def test_the_next_batch_is_started_while_the_current_one_runs(depth):
    """Depth 2: batch 2 is queued on the device before batch 1 is finished (the host's work overlaps the
    device's); depth 1: strictly one at a time. Either way every query gets its own answer, in order."""
    clf = FakeClassifier()
    clf.delay = 0.1
    w = EngineWorker(clf, depth=depth)

    async def scenario():
        futs = [f for q in "abcdefghij" for f in w.submit([Pending(q, time.perf_counter())])]
        return await asyncio.gather(*futs)

    out = run(scenario())
    assert [r.query for r in out] == list("abcdefghij") and all(r.ok for r in out)
    batches = [q for kind, q in clf.log if kind == "start"]
    assert batches == [tuple("abcd"), tuple("efgh"), tuple("ij")]  # all queued at once: full batches
    second_start = clf.log.index(("start", tuple("efgh")))
    first_finish = clf.log.index(("finish", tuple("abcd")))
    assert (second_start < first_finish) == (depth == 2), clf.log
    assert all("device_wait" not in r.timings_ms for r in out)
    if depth == 2:  # "e" was queued behind "a"'s batch: the device wait counts as queue wait
        assert out[4].timings_ms["queue_wait"] >= 50, out[4].timings_ms


def test_back_to_back_lone_requests_never_stall():
    """Each lone request must wake the launcher (not only the collector, which waits beside it)."""
    w = EngineWorker(FakeClassifier())

    async def scenario():
        for i in range(300):
            [fut] = w.submit([Pending(f"q{i}", time.perf_counter())])
            assert (await asyncio.wait_for(fut, 2.0)).query == f"q{i}"
    run(scenario())


@pytest.mark.parametrize("fill", [True, False])
def test_a_batch_behind_a_running_one_fills_until_just_before_it_ends(fill):
    """While "a" runs (100 ms, as measured at start-up), "b" and "c" arrive 10 and 20 ms in: with
    fill_while_busy they go together, launched before "a" ends; without it "b" goes at once and "c" waits
    for a free slot. A lone query on an idle device never waits."""
    clf = FakeClassifier()
    clf.delay, clf.device_ms = 0.1, {1: 100.0}
    w = EngineWorker(clf, depth=2, fill_while_busy=fill)

    async def scenario():
        t0 = time.perf_counter()
        futs = w.submit([Pending("a", t0)])
        for q in "bc":
            await asyncio.sleep(0.01)
            futs += w.submit([Pending(q, time.perf_counter())])
        out = await asyncio.gather(*futs)
        return out, t0

    out, t0 = run(scenario())
    assert [r.query for r in out] == ["a", "b", "c"] and all(r.ok for r in out)
    batches = [q for kind, q in clf.log if kind == "start"]
    assert batches == ([("a",), ("b", "c")] if fill else [("a",), ("b",), ("c",)]), clf.log
    assert out[0].timings_ms["queue_wait"] < 20  # "a" found the device idle
    if fill:
        assert clf.log.index(("start", ("b", "c"))) < clf.log.index(("finish", ("a",)))


def test_device_times_are_learnt_from_served_batches():
    """Start-up's measurement is the first estimate; each served batch moves the running mean toward it."""
    clf = FakeClassifier()
    clf.delay, clf.device_ms = 0.05, {1: 10.0}
    w = EngineWorker(clf)

    async def scenario():
        [f] = w.submit([Pending("a", time.perf_counter())])
        await f
    assert w._device_s == {1: 0.01}
    run(scenario())
    assert w._device_s[1] == pytest.approx(0.8 * 0.01 + 0.2 * 0.05)
