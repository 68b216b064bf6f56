"""EngineWorker without Ray: batches (two in flight, filling while the device is busy), per-query isolation of engine
errors, the health probe's rules, and a swap that lets the queries queued before it finish on the old configuration."""
from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest

from qcls.results.requests import INTERNAL_ERROR, Request, error_kind
from qcls.deployments.worker import EngineWorker, Pending
from qcls.scoring.tokenization import QueryEncoder
from qcls.results import LabelScore, PromptResult, QueryResult
from tests.deployments.helpers import HANG_GUARD_S, until_async


class FakeTokenizer:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


class FakeClassifier:
    """A device that runs one batch at a time: `start` queues a batch and returns at once, `finish` waits until
    the device is free, then until `gate` is open (a test holds a batch on the device by closing it), then
    `delay` seconds. Raises for queries in `poison`, or for everything once `dead`. `log` records every start
    and finish in order, `started_at` and `finished` when; `device_wait` is what the batch waited for the
    one before it, measured. A reload builds another one from `cfg.build()`, the test's steps (`in_steps`)."""

    def __init__(self, cfg=None, loaded=None):
        self.tokenizer = FakeTokenizer()
        self.cfg = cfg or fake_cfg()
        self.loaded = loaded
        self.encoder = QueryEncoder(self.tokenizer, 8)  # as Classifier builds it (no fast backend here)
        self.poison, self.dead, self.calls, self.delay = set(), False, [], 0.0
        self.gate: threading.Event | None = None
        self.log: list[tuple[str, tuple[str, ...]]] = []
        self.started_at: dict[tuple[str, ...], float] = {}
        self.finished: dict[tuple[str, ...], float] = {}
        self.device_ms: dict[int, float] = {}  # what Classifier measures at start-up
        self._device = threading.Lock()

    def start(self, queries):
        self.calls.append(list(queries))
        self.log.append(("start", tuple(queries)))
        if self.dead or self.poison & set(queries):
            raise RuntimeError("CUDA error: boom")
        self.started_at[tuple(queries)] = time.perf_counter()
        return list(queries), self.started_at[tuple(queries)]

    def finish(self, batch, wait_is_queue=False):
        queries, started = batch
        with self._device:
            begin = time.perf_counter()
            if self.gate is not None:
                assert self.gate.wait(HANG_GUARD_S), "the test never opened the gate"
            time.sleep(self.delay)
            self.log.append(("finish", tuple(queries)))
            self.finished[tuple(queries)] = time.perf_counter()
        extra = {"device_wait": (begin - started) * 1e3} if wait_is_queue else {}
        return [QueryResult(q, [PromptResult("p", "a", 1.0, [LabelScore("a", 0.0, 1.0, 1)])], None, len(q),
                            len(queries), {"forward": self.delay * 1e3, "score": 0.0, "total": 1.0, **extra})
                for q in queries]

    def classify(self, queries):
        return self.finish(self.start(queries))

    @classmethod
    def in_steps(cls, cfg, loaded=None):  # as Classifier.in_steps
        yield from cfg.build()
        return cls(cfg, loaded)

    def open(self, queries, cache=False):  # as Classifier.open
        return Request.open(queries, self.encoder, getattr(self, "cache", None) if cache else None,
                            getattr(self, "fingerprint", ""))

    def started(self, *queries: str) -> bool:
        return ("start", queries) in self.log


def fake_cfg(build=lambda: iter(())) -> SimpleNamespace:
    """A FakeClassifier's configuration; `build()`: the steps of a reload's build to it."""
    return SimpleNamespace(max_query_tokens=8, engine=SimpleNamespace(max_batch_size=4), build=build)


def run(coro):
    return asyncio.run(coro)


def answer(w: EngineWorker, queries: list[str]) -> list[QueryResult]:
    async def served():
        return await asyncio.gather(*w.submit([Pending(q, 0.0) for q in queries]))
    return run(served())


def test_poisoned_query_fails_alone_and_the_probe_clears_suspicion():
    clf = FakeClassifier()
    clf.poison = {"bad"}
    w = EngineWorker(clf)
    out = answer(w, ["a", "bad", "c"])
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
    out = answer(w, ["a"])
    assert not out[0].ok
    with pytest.raises(RuntimeError, match="engine unusable"):
        run(w.check())
    clf.dead = False
    with pytest.raises(RuntimeError, match="engine unusable"):  # a replica that broke is replaced, not trusted
        run(w.check())
    assert "engine unusable" in answer(w, ["a"])[0].error


def test_queries_arriving_during_a_forward_share_the_next_one():
    clf = FakeClassifier()
    clf.gate, clf.device_ms = threading.Event(), {1: 1e6}  # "a" holds the device until the gate opens
    w = EngineWorker(clf)
    arrived = {}

    async def scenario():
        first = w.submit([Pending("a", time.perf_counter())])
        await until_async(lambda: clf.started("a"), '"a" to start')  # on the device now
        later = []
        for q in "bcdef":  # five single-query requests
            arrived[q] = time.perf_counter()
            later += w.submit([Pending(q, arrived[q])])
        clf.gate.set()
        return await asyncio.gather(*first, *later)

    out = run(scenario())
    assert clf.calls == [["a"], ["b", "c", "d", "e"], ["f"]]  # at most engine.max_batch_size per forward
    assert [r.query for r in out] == list("abcdef") and [r.batch_size for r in out] == [1, 4, 4, 4, 4, 1]
    # "b" could not start before "a" finished, and its queue_wait counts that wait (a bound taken from the
    # events' own times, not from how fast the clock runs)
    assert out[1].timings_ms["queue_wait"] >= (clf.finished[("a",)] - arrived["b"]) * 1e3 > 0


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
    clf.gate = threading.Event()  # batch 1 stays on the device until the test has seen what depth allows
    w = EngineWorker(clf, depth=depth)

    async def scenario():
        futs = w.submit([Pending(q, time.perf_counter()) for q in "abcdefghij"])  # all queued at once
        await until_async(lambda: clf.started(*"efgh" if depth == 2 else "abcd"), "the batches depth allows")
        clf.gate.set()
        return await asyncio.gather(*futs)

    out = run(scenario())
    assert [r.query for r in out] == list("abcdefghij") and all(r.ok for r in out)
    batches = [q for kind, q in clf.log if kind == "start"]
    assert batches == [tuple("abcd"), tuple("efgh"), tuple("ij")]  # full batches
    second_start = clf.log.index(("start", tuple("efgh")))
    first_finish = clf.log.index(("finish", tuple("abcd")))
    assert (second_start < first_finish) == (depth == 2), clf.log
    assert all("device_wait" not in r.timings_ms for r in out)
    if depth == 2:  # "e" was queued behind "a"'s batch: the device wait counts as queue wait
        waited = clf.finished[tuple("abcd")] - clf.started_at[tuple("efgh")]  # from the events' own times
        assert out[4].timings_ms["queue_wait"] >= waited * 1e3 > 0


def test_back_to_back_lone_requests_never_stall():
    """Each lone request must wake the launcher (not only the collector, which waits beside it)."""
    w = EngineWorker(FakeClassifier())

    async def scenario():
        for i in range(300):
            [fut] = w.submit([Pending(f"q{i}", time.perf_counter())])
            # a hang guard: the bug this catches left a request waiting forever
            assert (await asyncio.wait_for(fut, HANG_GUARD_S)).query == f"q{i}"
    run(scenario())


def test_a_batch_behind_a_running_one_fills_while_the_device_is_busy():
    """With fill_while_busy, a query that arrives while "a" runs waits for company instead of taking the
    free slot at once: "b" and "c", arriving apart, go together (here the estimate of "a" is huge, so they go
    once it ends)."""
    clf = FakeClassifier()
    clf.gate, clf.device_ms = threading.Event(), {1: 1e6}
    w = EngineWorker(clf, depth=2, fill_while_busy=True)

    async def scenario():
        futs = w.submit([Pending("a", time.perf_counter())])
        await until_async(lambda: clf.started("a"), '"a" (a lone query on an idle device) to start')
        futs += w.submit([Pending("b", time.perf_counter())])
        await asyncio.sleep(0.05)  # room for the launcher to take "b" alone, were it to; nothing asserts on it
        futs += w.submit([Pending("c", time.perf_counter())])
        clf.gate.set()
        return await asyncio.gather(*futs)

    out = run(scenario())
    assert [r.query for r in out] == ["a", "b", "c"] and all(r.ok for r in out)
    assert [q for kind, q in clf.log if kind == "start"] == [("a",), ("b", "c")], clf.log


def test_a_filling_batch_is_launched_before_the_running_one_ends():
    """...but not later than shortly before the running batch should end by its measured device time, so
    the device never waits: "b" starts while "a" is still on the device (held there until then)."""
    clf = FakeClassifier()
    clf.gate, clf.device_ms = threading.Event(), {1: 400.0}
    w = EngineWorker(clf, depth=2, fill_while_busy=True)

    async def scenario():
        futs = w.submit([Pending("a", time.perf_counter())])
        await until_async(lambda: clf.started("a"), '"a" to start')
        futs += w.submit([Pending("b", time.perf_counter())])
        await until_async(lambda: clf.started("b"), '"b" to start before "a" ends')
        clf.gate.set()
        return await asyncio.gather(*futs)

    out = run(scenario())
    assert [r.query for r in out] == ["a", "b"] and all(r.ok for r in out)
    assert clf.log.index(("start", ("b",))) < clf.log.index(("finish", ("a",)))


def test_without_filling_a_free_slot_takes_what_waits_at_once():
    """fill_while_busy=false: "b" takes the free slot at once; "c" waits for one."""
    clf = FakeClassifier()
    clf.gate, clf.device_ms = threading.Event(), {1: 1e6}
    w = EngineWorker(clf, depth=2, fill_while_busy=False)

    async def scenario():
        futs = w.submit([Pending("a", time.perf_counter())])
        await until_async(lambda: clf.started("a"), '"a" to start')
        futs += w.submit([Pending("b", time.perf_counter())])
        await until_async(lambda: clf.started("b"), '"b" to take the free slot')
        futs += w.submit([Pending("c", time.perf_counter())])
        clf.gate.set()
        return await asyncio.gather(*futs)

    out = run(scenario())
    assert [r.query for r in out] == ["a", "b", "c"] and all(r.ok for r in out)
    assert [q for kind, q in clf.log if kind == "start"] == [("a",), ("b",), ("c",)], clf.log
    assert clf.log.index(("start", ("c",))) > clf.log.index(("finish", ("a",)))  # both slots were taken


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


def test_a_swap_lets_the_queued_queries_finish_on_the_old_classifier():
    """A reload swaps the active Classifier between two batches: the queries queued before it run on the old one
    (never in a batch with later ones), those queued after on the new one, and none fails."""
    old = FakeClassifier()
    old.gate = threading.Event()  # the old one's first batch holds the device while the test queues and swaps
    w = EngineWorker(old, depth=1)

    async def scenario():
        before = w.submit([Pending(q, time.perf_counter()) for q in "abcdef"])
        await until_async(lambda: old.started(*"abcd"), "the first batch on the device")
        w.give_s = 0.0  # the build's one step runs once the batches in flight are answered
        built = w.reload(fake_cfg(build=lambda: iter(["the one step"])))
        old.gate.set()
        await until_async(built.done, "the swap")
        after = w.submit([Pending(q, time.perf_counter()) for q in "xy"])
        return built.result(), await asyncio.gather(*before, *after)

    new, out = run(scenario())
    assert [r.query for r in out] == list("abcdefxy") and all(r.ok for r in out)
    assert [q for kind, q in old.log if kind == "start"] == [tuple("abcd"), tuple("ef")]
    assert [q for kind, q in new.log if kind == "start"] == [tuple("xy")]
    assert w.clf is new


def test_a_probe_without_an_answer_logs_where_every_thread_is(caplog):
    """A hung device thread is replaced by Serve without a trace: the probe's log must show where it waits."""
    clf = FakeClassifier()
    clf.gate = threading.Event()  # the probe's forward never ends until the test opens the gate
    w = EngineWorker(clf, probe_idle_s=0.0, probe_timeout_s=0.2)
    try:
        with caplog.at_level("ERROR", logger="qcls.serve"), pytest.raises(RuntimeError, match="no answer"):
            run(w.check())
    finally:
        clf.gate.set()
    (record,) = [r for r in caplog.records if "every thread's stack" in r.getMessage()]
    text = record.getMessage()
    # the launcher thread, stopped in the fake device's wait: named with the line it waits on
    assert "--- thread qcls-launch" in text and "in finish" in text and "self.gate.wait" in text


def test_a_batch_stuck_on_the_device_under_load_fails_the_check_without_waiting_for_an_idle_spell(caplog):
    """Under load no idle spell ever starts a probe: a forward that has not returned for longer than a probe may
    take is the evidence itself, and the replica must be replaced (with every thread's stack in its log)."""
    clf = FakeClassifier()
    clf.gate = threading.Event()  # the batch's forward never ends until the test opens the gate
    w = EngineWorker(clf, probe_idle_s=3600.0, probe_timeout_s=0.2)

    async def scenario():
        futures = w.submit([Pending("a", time.perf_counter())])
        await until_async(lambda: clf.started("a"), '"a" to start')
        w.last_ok = time.monotonic()  # traffic was flowing: no idle spell, so no probe
        await asyncio.sleep(0.3)
        with caplog.at_level("ERROR", logger="qcls.serve"), pytest.raises(RuntimeError, match="has not returned"):
            await w.check()
        clf.gate.set()
        return await asyncio.gather(*futures)

    try:
        assert run(scenario())[0].ok  # the forward itself still ends, but the replica stays unusable
    finally:
        clf.gate.set()
    assert w.broken and any("every thread's stack" in r.getMessage() for r in caplog.records)
