"""The device turns of a reload's build beside the serving batches (EngineWorker's DeviceSharing), on the
worker tests' fake device: a held device has no batch in flight and starts none; giving way runs what waited."""
from __future__ import annotations

import asyncio
import threading
import time

from qcls.deployments.worker import EngineWorker, Pending
from tests.deployments.helpers import HANG_GUARD_S, until_async
from tests.deployments.test_worker import FakeClassifier, run


def test_a_build_holds_the_device_between_batches_and_gives_way_to_the_queries_that_waited():
    clf = FakeClassifier()
    clf.gate = threading.Event()  # "a" stays on the device until the test opens the gate
    w = EngineWorker(clf)
    w.slice_s = 0.0  # every give_way gives way (the fake's steps are instants)
    w.give_s = HANG_GUARD_S  # what waits is launched before the build takes the device back, however slow the host
    step = {name: threading.Event() for name in ("give way", "release")}

    def build():  # what a reload's thread does: hold, a step, give way, a step, release
        w.hold_device()
        clf.log.append(("build", "held"))
        assert step["give way"].wait(HANG_GUARD_S)
        w.give_way()
        clf.log.append(("build", "held again"))
        assert step["release"].wait(HANG_GUARD_S)
        w.release_device()

    async def scenario():
        first = w.submit([Pending("a", time.perf_counter())])
        await until_async(lambda: clf.started("a"), '"a" on the device')
        builder = threading.Thread(target=build, daemon=True)
        builder.start()
        await until_async(lambda: w._held == 1, "the build to ask for the device")
        assert ("build", "held") not in clf.log  # "a" is still in flight: the build waits for it
        during = w.submit([Pending("b", time.perf_counter())])  # asked for while the build waits and holds
        clf.gate.set()
        await until_async(lambda: ("build", "held") in clf.log, "the build to hold the device")
        assert not clf.started("b")  # held: nothing is launched
        step["give way"].set()
        await until_async(lambda: ("build", "held again") in clf.log, "the build to hold the device again")
        assert clf.log.index(("finish", ("b",))) < clf.log.index(("build", "held again"))  # "b" ran in between
        after = w.submit([Pending("c", time.perf_counter())])
        step["release"].set()
        out = await asyncio.gather(*first, *during, *after)
        builder.join(HANG_GUARD_S)
        return out

    out = run(scenario())
    assert [r.query for r in out] == list("abc") and all(r.ok for r in out)
    assert [e for e in clf.log if e[0] != "start"] == [
        ("finish", ("a",)), ("build", "held"), ("finish", ("b",)), ("build", "held again"), ("finish", ("c",))]
    assert w._held == 0


def test_a_held_device_holds_the_probes_too_and_an_idle_one_is_held_at_once():
    """A probe is a forward: it waits for the build's turn to end like any batch. With nothing in flight or
    waiting, holding takes no wait at all (start-up, a build on an idle replica)."""
    clf = FakeClassifier()
    w = EngineWorker(clf, probe_idle_s=0.0)
    w.hold_device()
    assert w._held == 1 and clf.calls == []

    async def scenario():
        probe = asyncio.ensure_future(w.check())
        await asyncio.sleep(0.05)
        assert not probe.done() and clf.calls == []  # the probe waits for the device
        w.release_device()
        await probe

    run(scenario())
    assert len(clf.calls) == 1


def test_a_probe_asked_for_during_a_build_runs_when_the_build_gives_way():
    """An idle replica's health probe waits for the build's next give_way, not for the whole build: a probe held
    for longer than it may take would mark the replica broken."""
    clf = FakeClassifier()
    w = EngineWorker(clf, probe_idle_s=0.0)
    w.slice_s, w.give_s = 0.0, HANG_GUARD_S
    w.hold_device()

    async def scenario():
        probe = asyncio.ensure_future(w.check())
        await until_async(lambda: w._jobs, "the probe to wait for the device")
        await asyncio.to_thread(w.give_way)  # the build's next step boundary
        assert len(clf.calls) == 1 and w._held == 1  # the probe ran in between; the build holds the device again
        await probe
        w.release_device()

    run(scenario())
    assert w.broken is None
