"""A reload on the replica's device owner (EngineWorker.reload), on the worker tests' fake device: each build step runs
with no batch in flight and none launched; what waited runs between two steps; the swap comes after the last step; a
step's error reaches the reload's caller, the old configuration serves on and what the build left goes back to the
device; a later reload supersedes a build; the replaced configuration's memory goes back once it is dropped."""
from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref

import pytest

from qcls.classifier import WARMUP_QUERY
from qcls.deployments import reload as reload_module
from qcls.deployments.reload import Superseded
from qcls.deployments.worker import EngineWorker, Pending
from tests.deployments.helpers import HANG_GUARD_S, until_async
from tests.deployments.test_worker import FakeClassifier, answer, fake_cfg, run


def _steps(w: EngineWorker, log: list, gates: list[threading.Event], fail_at: int | None = None):
    """A build's configuration whose step k logs ("build", k, batches in flight) and waits for gates[k]."""
    def build():
        for k, gate in enumerate(gates):
            log.append(("build", k, w._inflight))
            if k == fail_at:
                raise RuntimeError("CUDA out of memory (a test's)")
            assert gate.wait(HANG_GUARD_S)
            yield f"step {k}"
    return fake_cfg(build=build)


class Releases:
    """Each release of device memory on `worker`: (the thread that ran it, batches in flight then)."""

    def __init__(self):
        self.calls: list[tuple[str, int]] = []
        self.worker: EngineWorker | None = None

    def free(self, clf):
        if self.worker is not None:  # (another test's worker may give back what it replaced meanwhile)
            self.calls.append((threading.current_thread().name, self.worker._inflight))
        return 12.5, 9.75, 9.5  # GiB reserved before and after, allocated


@pytest.fixture
def freed(monkeypatch) -> Releases:
    releases = Releases()
    monkeypatch.setattr(reload_module, "free_device_memory", releases.free)
    return releases


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
        built = w.reload(_steps(w, clf.log, gates))
        await asyncio.sleep(0.05)
        assert not any(e[0] == "build" for e in clf.log)  # "a" is still in flight: the step waits for it
        clf.gate.set()
        await until_async(lambda: ("build", 0, 0) in clf.log, "the first step, with nothing in flight")
        during = w.submit([Pending("b", time.perf_counter())])  # asked for while a step runs
        await asyncio.sleep(0.05)
        assert not clf.started("b")  # nothing is launched beside a step
        gates[0].set()
        await until_async(lambda: ("build", 1, 0) in clf.log, "the second step, with nothing in flight")
        assert clf.log.index(("finish", ("b",))) < clf.log.index(("build", 1, 0))  # "b" ran in between
        after = w.submit([Pending("c", time.perf_counter())])  # queued before the swap: on the old configuration
        gates[1].set()
        answers = await asyncio.gather(*first, *during, *after)
        return answers, built.result(HANG_GUARD_S)

    answers, new = run(scenario())
    assert [r.query for r in answers] == list("abc") and all(r.ok for r in answers)
    assert w.clf is new and new is not clf and not w._builds
    assert [e[:2] for e in clf.log if e[0] != "start"] == [
        ("finish", ("a",)), ("build", 0), ("finish", ("b",)), ("build", 1), ("finish", ("c",))]
    assert [r.query for r in answer(w, ["d"])] == ["d"] and new.started("d")  # the new one answers from now on


def test_a_probe_asked_for_during_a_build_runs_between_its_steps():
    """An idle replica's health probe waits for the build's current step, not for the whole build: a probe held for
    longer than it may take would mark the replica broken."""
    clf = FakeClassifier()
    w = EngineWorker(clf, probe_idle_s=0.0)
    w.slice_s, w.give_s = 0.0, HANG_GUARD_S
    gates = [threading.Event(), threading.Event()]

    async def scenario():
        built = w.reload(_steps(w, clf.log, gates))
        await until_async(lambda: ("build", 0, 0) in clf.log, "the first step")
        probe = asyncio.ensure_future(w.check())
        await until_async(lambda: w._probes, "the probe to wait for the device")
        assert clf.calls == []  # a probe is a forward: it waits for the step
        gates[0].set()
        await probe
        await until_async(lambda: ("build", 1, 0) in clf.log, "the second step")
        assert clf.log.index(("finish", (WARMUP_QUERY,))) < clf.log.index(("build", 1, 0))  # the probe in between
        gates[1].set()
        return built.result(HANG_GUARD_S)

    assert run(scenario()) is w.clf
    assert w.broken is None


def test_a_failed_step_reaches_the_caller_the_old_one_serves_on_and_the_builds_memory_goes_back(freed):
    clf = FakeClassifier()
    freed.worker = w = EngineWorker(clf)
    gates = [threading.Event(), threading.Event()]
    gates[0].set()
    with pytest.raises(RuntimeError, match="a test's") as failure:
        w.reload(_steps(w, clf.log, gates, fail_at=1)).result(HANG_GUARD_S)
    assert not any(entry.name == "build" for entry in failure.traceback)  # its frames held what the build allocated
    assert ("build", 1, 0) in clf.log and not w._builds and w.clf is clf
    assert [r.ok for r in answer(w, ["x"])] == [True]
    assert freed.calls == [("qcls-launch", 0)]  # by the device's owner, alone on the device (empty_cache synchronizes it)
    w.close()


def test_a_reload_asked_for_during_a_build_supersedes_it():
    clf = FakeClassifier()
    w = EngineWorker(clf)
    w.slice_s = 0.0
    gates = [threading.Event(), threading.Event()]
    first = w.reload(_steps(w, clf.log, gates))
    run(until_async(lambda: ("build", 0, 0) in clf.log, "the first build's first step"))
    second = w.reload(fake_cfg(build=lambda: iter(["its one step"])))
    gates[0].set()
    with pytest.raises(Superseded):
        first.result(HANG_GUARD_S)
    assert second.result(HANG_GUARD_S) is w.clf and ("build", 1, 0) not in clf.log  # the first one never finished
    assert w.reload(w.clf.cfg).result(0) is w.clf  # what serves already: nothing to build
    w.close()


def test_the_replaced_configuration_is_dropped_once_its_queries_are_answered_and_its_memory_goes_back(freed, caplog):
    clf = FakeClassifier()
    clf.gate = threading.Event()
    freed.worker = w = EngineWorker(clf)
    gone = [False]
    weakref.finalize(clf, gone.__setitem__, 0, True)

    async def scenario():
        queued = w.submit([Pending("a", time.perf_counter())])
        await until_async(lambda: clf.started("a"), '"a" on the old configuration')
        w.give_s = 0.0
        built = w.reload(fake_cfg(build=lambda: iter(["its one step"])))
        await asyncio.sleep(0.05)
        assert not built.done() and freed.calls == []  # its build step waits for "a"
        clf.gate.set()
        return await asyncio.gather(*queued), built

    with caplog.at_level(logging.WARNING, logger=reload_module.log.name):
        out, built = run(scenario())
        del clf
        # the worker logs the release after giving the memory back, on its own thread: wait for the line itself
        run(until_async(lambda: freed.calls and "memory reserved by torch" in caplog.text,
                        "the replaced configuration's memory to go back, and its log line"))
    assert out[0].ok and gone[0] and built.result() is w.clf
    assert freed.calls == [("qcls-launch", 0)]
    assert "memory reserved by torch 12.50 → 9.75 GiB (allocated 9.50 GiB)" in caplog.text
    assert "(0 garbage collections)" in caplog.text


def test_a_closing_replica_ends_the_builds_that_wait():
    clf = FakeClassifier()
    clf.gate = threading.Event()
    w = EngineWorker(clf)

    async def scenario():
        first = w.submit([Pending("a", time.perf_counter())])
        await until_async(lambda: clf.started("a"), '"a" on the device')
        built = w.reload(_steps(w, clf.log, [threading.Event()]))
        w.close()
        clf.gate.set()
        await asyncio.gather(*first)  # what was launched is still answered
        return built

    built = run(scenario())
    with pytest.raises(RuntimeError, match="shutting down"):
        built.result(HANG_GUARD_S)
    assert not any(e[0] == "build" for e in clf.log)
    with pytest.raises(RuntimeError, match="shutting down"):
        w.reload(fake_cfg())
