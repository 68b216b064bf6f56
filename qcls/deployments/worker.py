"""The engine side of a replica and the one owner of its device: the active Classifier and all device work. `step()`
makes every decision: what is due (a reload's build step, the release of a replaced configuration's memory, a health
probe, the next batch), then runs it; `reload()` asks for a new configuration. The launcher thread loops on `step()`;
the collector thread waits for each launched batch's forward, builds its results and delivers them, so that the next
batch is prepared while the one before it runs. Probes: health.py; which queries reach the worker: Classifier.open.
Free of Ray and HTTP: the same object under a handle, a route or a unit test.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

from qcls.deployments.health import HealthChecks
from qcls.deployments.reload import Build, Release, give_back
from qcls.results import QueryResult
from qcls.results.requests import failed, finish_batch, start_batch

if TYPE_CHECKING:
    from qcls.classifier import Classifier
    from qcls.config import QclsConfig
    from qcls.deployments.metrics import ReplicaMetrics

log = logging.getLogger("qcls.serve")

# While one batch runs, the next is launched this long before the running one should end (at least LEAD_MIN_S, else
# LEAD_SHARE of its device time): enough for the host to tokenize and queue it, so the device does not wait.
LEAD_MIN_S, LEAD_SHARE = 1e-3, 0.25
# A build's next step waits at most this long after its last one for the queries and probes that waited meanwhile to
# be launched; then no batch is launched until it has run.
GIVE_S = 0.05
# Steps of a build run back to back while their turn is shorter than this: a step this short costs the queries less
# than a drain of the batches in flight would cost the build; longer turns would add to a query's wait.
SLICE_S = 0.005


@dataclass
class Pending:
    """One query waiting for a batch; `arrived` (perf_counter) is when its request reached the replica; `clf` the
    Classifier active when it was queued (set by `submit`): the queries queued before a reload's swap run on theirs."""

    query: str
    arrived: float
    clf: Classifier | None = None


class EngineWorker(HealthChecks):
    def __init__(self, clf: Classifier, probe_idle_s: float = 60.0, probe_timeout_s: float = 20.0,
                 observer: ReplicaMetrics | None = None, depth: int = 2, fill_while_busy: bool = True):
        self.clf, self.observer, self.max_batch = clf, observer, clf.cfg.engine.max_batch_size
        self._init_health(probe_idle_s, probe_timeout_s)
        # `depth` batches in flight: with 2, the host's work on one overlaps the device's on the other. fill_while_busy:
        # a batch that would queue behind a running one fills until shortly before that one should end (`_choose`).
        self.depth, self.fill_while_busy = depth, fill_while_busy
        self._device_s = {b: ms / 1e3 for b, ms in clf.device_ms.items()}  # batch size → device time, a running mean
        self._busy_until = 0.0  # perf_counter when the device should be done with every launched batch
        self._launch_by = 0.0  # perf_counter by which the next batch should be on its way to the device
        self._lock = threading.RLock()  # (re-entered by a replaced Classifier's finalizer: `_wake`)
        self._work = threading.Condition(self._lock)  # step() waits here for something to be due
        self._ready = threading.Condition(self._lock)  # the collector waits here: a launched batch
        self._waiting: deque[tuple[Pending, asyncio.Future, asyncio.AbstractEventLoop]] = deque()
        self._probes: deque[Future] = deque()  # health probes asked for
        self._launched: deque[tuple[list, object, float]] = deque()  # (chunk, started batch, launch time)
        self._inflight = 0  # batches launched and not yet answered, probes included
        self._builds: deque[Build] = deque()  # reloads' builds, the first one building; earlier ones superseded
        self._step_at = 0.0  # monotonic time by which the next build step runs even if queries wait
        self._releases: list[Release] = []  # replaced configurations whose memory goes back once they are dropped
        self.give_s, self.slice_s = GIVE_S, SLICE_S
        self._closed = False
        threading.Thread(target=self._launch_loop, name="qcls-launch", daemon=True).start()
        threading.Thread(target=self._collect_loop, name="qcls-collect", daemon=True).start()

    def _launch_loop(self) -> None:
        while self.step():
            pass

    def step(self) -> bool:
        """Wait until something is due, run it; False once the worker is closed. `_choose` decides, in this order: work
        that runs alone on the device (the release of a replaced configuration's memory, a reload's next build step):
        the batches in flight end first and nothing is launched meanwhile; a health probe; the next batch, once a slot
        is free and the waiting queries have gathered long enough. The collector delivers a batch's results."""
        with self._lock:
            what, wait_s = self._choose()
            while what is None:
                self._work.wait(wait_s)
                what, wait_s = self._choose()
            probe = self._probes.popleft() if what == "probe" else None
            chunk = self._take() if what == "batch" else []
            self._inflight += bool(probe or chunk)
        if what == "closed":
            for build in self._builds:  # (reload() takes no new ones once closed)
                build.steps.close()
                build.done.set_exception(RuntimeError("the replica is shutting down"))
            return False
        if what == "release":
            self._release_memory()
        elif what == "build":
            self._build_turn()
        elif probe is not None:
            self._run_probe(probe)
        elif chunk:
            self._launch(chunk)
        return True

    def _choose(self) -> tuple[str | None, float | None]:
        """Under the lock: what is due, or (None, seconds until something may be; None: until notified)."""
        if self._closed:
            return "closed", None
        now, queued = time.monotonic(), bool(self._waiting or self._probes)
        alone = ("release" if any(r.dropped or now >= r.collect_at for r in self._releases) else
                 "build" if self._builds and (not queued or now >= self._step_at) else None)
        if alone:
            return (alone, None) if self._inflight == 0 else (None, None)  # woken once a batch is answered
        free = self._inflight < self.depth
        if free and self._probes:
            return "probe", None
        # with fill_while_busy, the waiting queries gather while the device is busy and no full batch waits, until
        # shortly before the batch in flight should end: fuller batches, and the device does not wait
        hold = None
        if free and self._waiting:
            gather = self.fill_while_busy and self._inflight and len(self._waiting) < self.max_batch
            hold = self._launch_by - time.perf_counter() if gather else 0.0
        if hold is not None and hold <= 0:
            return "batch", None
        due = ([hold] if hold is not None else []) + ([self._step_at - now] if self._builds else [])
        return None, min(due + [r.collect_at - now for r in self._releases], default=None)

    # -- queries ---------------------------------------------------------------------------------------------------

    def submit(self, items: list[Pending]) -> list[asyncio.Future]:
        """Queue queries for the device; each future resolves to its QueryResult. A query that finds the device idle
        starts at once; those that arrive while a forward runs wait, and the next forward takes up to max_batch_size of
        them together (whichever request they came from): batches fill from the load itself, with no timer."""
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in items]
        with self._lock:
            for it in items:
                it.clf = it.clf or self.clf
            self._waiting.extend((it, fut, loop) for it, fut in zip(items, futures))
            self._work.notify()
        return futures

    def _take(self) -> list:
        """The next batch: up to max_batch waiting queries of one Classifier (those queued before a swap form the last
        batches of the old one)."""
        chunk = []
        while self._waiting and len(chunk) < self.max_batch:
            if chunk and self._waiting[0][0].clf is not chunk[0][0].clf:
                break
            item = self._waiting.popleft()
            if not item[1].done():  # a cancelled request gives up its slot
                chunk.append(item)
        return chunk

    def _launch(self, chunk: list) -> None:
        """Start a batch (tokenize, queue its forward behind the running one) and hand it to the collector."""
        started, clf, queries = time.perf_counter(), chunk[0][0].clf, [it.query for it, _, _ in chunk]
        with self._device_step("launch"):  # the answers already known when the engine is unusable
            batch = clf, ([failed(q, f"engine unusable: {self.broken}") for q in queries] if self.broken
                          else start_batch(clf, queries))
        with self._lock:
            self._launched.append((chunk, batch, started))
            self._ready.notify()
            device_s = self._device_s.get(len(chunk), 0.0)
            self._busy_until = max(time.perf_counter(), self._busy_until) + device_s
            self._launch_by = self._busy_until - max(LEAD_MIN_S, LEAD_SHARE * device_s)

    def _finish(self, items: list[Pending], batch, started: float) -> list[QueryResult]:
        """A started batch's results (a batch whose forward raises is retried query by query: only the queries that
        raise fail). queue_wait: arrival at the replica to the launch, plus the forward's wait for the device."""
        clf, batch = batch
        if isinstance(batch, list):
            results = batch
        else:
            results = finish_batch(clf, [it.query for it in items], batch, self._engine_error, wait_is_queue=True)
            if any(r.ok for r in results):
                self._ok()
        for it, r in zip(items, results):
            waited = r.timings_ms.pop("device_wait", 0.0)
            r.timings_ms["queue_wait"] = round((started - it.arrived) * 1e3 + waited, 4)
        t = next((r.timings_ms for r in results if r.ok and "forward" in r.timings_ms), None)
        if t is not None:  # the running mean of this batch size's device time (a forward's time barely varies)
            b, s = results[0].batch_size or len(results), (t["forward"] + t.get("score", 0.0)) / 1e3
            self._device_s[b] = s if b not in self._device_s else 0.8 * self._device_s[b] + 0.2 * s
        return results

    def _collect_loop(self) -> None:
        while True:
            with self._lock:
                while not (self._launched or self._closed):
                    self._ready.wait()
                if not self._launched:
                    return
                chunk, batch, started = self._launched.popleft()
            try:
                with self._device_step("collect"):
                    answer: list[QueryResult] | BaseException = self._finish([it for it, _, _ in chunk], batch, started)
            except BaseException as e:  # noqa: BLE001 - never leave a caller waiting forever
                answer = e
            self._settled()
            for loop in {lp for _, _, lp in chunk}:
                mine = [(i, fut) for i, (_, fut, lp) in enumerate(chunk) if lp is loop]
                try:
                    loop.call_soon_threadsafe(self._deliver, mine, answer)
                except RuntimeError:  # that caller's event loop is gone
                    pass
            chunk = batch = mine = None  # an idle replica keeps no Classifier alive: after a swap, the replaced one

    def _settled(self) -> None:
        with self._lock:
            self._inflight -= 1
            self._work.notify()

    def _deliver(self, mine: list[tuple[int, asyncio.Future]], answer) -> None:
        for i, fut in mine:
            if fut.done():
                continue
            if isinstance(answer, BaseException):
                fut.set_exception(answer if isinstance(answer, Exception) else RuntimeError("engine thread failed"))
            else:
                fut.set_result(answer[i])
        if self.observer is not None and not isinstance(answer, BaseException):
            # after the answers, whose callbacks are already scheduled
            asyncio.get_running_loop().call_soon(self.observer.after_batch, [answer[i] for i, _ in mine])

    # -- reloads ------------------------------------------------------------------------------------------------------

    def reload(self, cfg: QclsConfig) -> Future:
        """Serve `cfg` on the active configuration's weights: its build (Classifier.in_steps) runs one step at a time
        between batches (`_build_turn`), then it is swapped in between two batches (queries queued before finish on
        the old one), and the old one's device memory goes back once nothing holds it (`_release_memory`). A failed
        build leaves the old configuration serving and its memory is given back; a later reload supersedes a build at
        its next step. The future: the Classifier serving `cfg` (the active one if it is `cfg` already), or why not."""
        done: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the replica is shutting down")
            for build in self._builds:
                build.superseded = True
            if cfg == self.clf.cfg:
                done.set_result(self.clf)
                return done
            if not self._builds:
                self._step_at = time.monotonic() + self.give_s
            self._builds.append(Build(type(self.clf).in_steps(cfg, loaded=self.clf.loaded), done))
            self._work.notify()
        return done

    def _build_turn(self) -> None:
        """The first build's next steps, alone on the device (Build.turn); after its last one, the swap."""
        build = self._builds[0]
        with self._device_step("launch"):
            built, error = build.turn(self.slice_s)
        with self._lock:
            self._step_at = time.monotonic() + self.give_s
            if built is None and error is None:
                return  # its next steps in a later turn
            self._builds.popleft()
            replaced = self.clf
            if built is not None:
                self.clf, self._device_s = built, {b: ms / 1e3 for b, ms in built.device_ms.items()}
        # the replaced configuration's memory goes back once nothing holds it; what a failed build left, at once
        self._releases.append(Release(weakref.finalize(replaced, self._wake) if built is not None else None))
        if error is not None:
            build.done.set_exception(error)
        else:
            build.done.set_result(built)

    def _wake(self) -> None:  # a replaced Classifier was dropped
        with self._lock:
            self._work.notify()

    def _release_memory(self) -> None:
        """What the dropped configurations held goes back to the device (empty_cache: a device-wide synchronization);
        one still held gets its next garbage collection, if due (Release.collect)."""
        for r in [r for r in self._releases if not r.dropped and time.monotonic() >= r.collect_at]:
            if not r.collect():
                self._releases.remove(r)
        dropped = [r for r in self._releases if r.dropped]
        self._releases = [r for r in self._releases if r not in dropped]
        if dropped:
            with self._device_step("launch"):
                give_back(dropped, self.clf)

    def close(self) -> None:
        """Stop the device threads once the batches in flight are answered (Serve calls this once drained)."""
        with self._lock:
            self._closed = True
            self._work.notify_all()
            self._ready.notify_all()
