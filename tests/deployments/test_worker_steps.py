"""The replica's device owner runs a build's steps between its batches (EngineWorker.run_steps), on the worker
tests' fake device: a step runs with no batch in flight and none launched; what waited runs between two steps;
a step's error reaches the build's caller and the replica keeps serving."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from qcls.classifier import WARMUP_QUERY
from qcls.deployments.worker import EngineWorker, Pending
from tests.deployments.helpers import HANG_GUARD_S, until_async
from tests.deployments.test_worker import FakeClassifier, run


def _build(w: EngineWorker, log: list, gates: list[threading.Event], fail_at: int | None = None):
    """A build whose step k logs ("build", k, batches in flight) and waits for gates[k]."""
    for k, gate in enumerate(gates):
        log.append(("build", k, w._inflight))
        if k == fail_at:
            raise RuntimeError("CUDA out of memory (a test's)")
        assert gate.wait(HANG_GUARD_S)
        yield
    return "built"


def _in_thread(fn, *args) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def call():
        try:
            out["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - the test reads it
            out["error"] = e
    t = threading.Thread(target=call, daemon=True)
    t.start()
    return t, out


def test_build_steps_run_with_nothing_in_flight_and_the_queries_that_waited_run_between_them():
    clf = FakeClassifier()
    clf.gate = threading.Event()  # "a" stays on the device until the test opens the gate
    w = EngineWorker(clf)
    w.slice_s = 0.0  # one step a turn (the fake's steps are instants)
    w.give_s = HANG_GUARD_S  # what waits is launched before the next step, however slow the host
    gates = [threading.Event(), threading.Event()]

    async def scenario():
        first = w.submit([Pending("a", time.perf_counter())])
        await until_async(lambda: clf.started("a"), '"a" on the device')
        builder, out = _in_thread(w.run_steps, _build(w, clf.log, gates))
        await until_async(lambda: w._builds, "the build to be queued")
        assert not any(e[0] == "build" for e in clf.log)  # "a" is still in flight: the step waits for it
        clf.gate.set()
        await until_async(lambda: ("build", 0, 0) in clf.log, "the first step, with nothing in flight")
        during = w.submit([Pending("b", time.perf_counter())])  # asked for while a step runs
        await asyncio.sleep(0.05)
        assert not clf.started("b")  # nothing is launched beside a step
        gates[0].set()
        await until_async(lambda: ("build", 1, 0) in clf.log, "the second step, with nothing in flight")
        assert clf.log.index(("finish", ("b",))) < clf.log.index(("build", 1, 0))  # "b" ran in between
        after = w.submit([Pending("c", time.perf_counter())])
        gates[1].set()
        answers = await asyncio.gather(*first, *during, *after)
        builder.join(HANG_GUARD_S)
        return answers, out

    answers, out = run(scenario())
    assert [r.query for r in answers] == list("abc") and all(r.ok for r in answers)
    assert out == {"value": "built"} and not w._builds
    assert [e[:2] for e in clf.log if e[0] != "start"] == [
        ("finish", ("a",)), ("build", 0), ("finish", ("b",)), ("build", 1), ("finish", ("c",))]


def test_a_probe_asked_for_during_a_build_runs_between_its_steps():
    """An idle replica's health probe waits for the build's current step, not for the whole build: a probe held for
    longer than it may take would mark the replica broken."""
    clf = FakeClassifier()
    w = EngineWorker(clf, probe_idle_s=0.0)
    w.slice_s, w.give_s = 0.0, HANG_GUARD_S
    gates = [threading.Event(), threading.Event()]

    async def scenario():
        builder, out = _in_thread(w.run_steps, _build(w, clf.log, gates))
        await until_async(lambda: ("build", 0, 0) in clf.log, "the first step")
        probe = asyncio.ensure_future(w.check())
        await until_async(lambda: w._jobs, "the probe to wait for the device")
        assert clf.calls == []  # a probe is a forward: it waits for the step
        gates[0].set()
        await probe
        await until_async(lambda: ("build", 1, 0) in clf.log, "the second step")
        assert clf.log.index(("finish", (WARMUP_QUERY,))) < clf.log.index(("build", 1, 0))  # the probe in between
        gates[1].set()
        builder.join(HANG_GUARD_S)
        return out

    assert run(scenario()) == {"value": "built"}
    assert w.broken is None


def test_a_failed_step_reaches_the_builds_caller_and_the_replica_keeps_serving():
    clf = FakeClassifier()
    w = EngineWorker(clf)
    gates = [threading.Event(), threading.Event()]
    gates[0].set()
    with pytest.raises(RuntimeError, match="a test's"):
        w.run_steps(_build(w, clf.log, gates, fail_at=1))
    assert ("build", 1, 0) in clf.log and not w._builds

    async def serve():
        return await asyncio.gather(*w.submit([Pending("x", time.perf_counter())]))

    assert [r.ok for r in run(serve())] == [True]


def test_a_closing_replica_ends_the_builds_that_wait():
    clf = FakeClassifier()
    clf.gate = threading.Event()
    w = EngineWorker(clf)

    async def scenario():
        first = w.submit([Pending("a", time.perf_counter())])
        await until_async(lambda: clf.started("a"), '"a" on the device')
        builder, out = _in_thread(w.run_steps, _build(w, clf.log, [threading.Event()]))
        await until_async(lambda: w._builds, "the build to be queued")
        w.close()
        clf.gate.set()
        await asyncio.gather(*first)  # what was launched is still answered
        builder.join(HANG_GUARD_S)
        return out

    out = run(scenario())
    assert "shutting down" in str(out["error"]) and not any(e[0] == "build" for e in clf.log)
    with pytest.raises(RuntimeError, match="shutting down"):
        w.run_steps(_build(w, clf.log, []))
