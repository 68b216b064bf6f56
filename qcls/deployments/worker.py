"""The engine side of a replica and the one owner of its device: one Classifier, the two threads that drive the device
(one launches batches, one collects them, so that a batch is prepared while the one before it runs), and every other
piece of device work the replica does, run by the launcher between batches: health probes (health.py), a reload's
build one step at a time (`run_steps`: Classifier.in_steps) and the release of a replaced configuration's memory.
Per-query failure isolation: health.py; which queries reach it: Classifier.open. Free of Ray and HTTP, so it is the
same object under a handle, a route or a unit test.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Generator, Protocol

from qcls.classifier import Classifier
from qcls.deployments.health import HealthChecks
from qcls.results import QueryResult

log = logging.getLogger("qcls.serve")

# While one batch runs, the next is launched this long before the running one should end (at least
# LEAD_MIN_S, else LEAD_SHARE of its device time): enough for the host to tokenize and queue it (and for a
# busy event loop to hand the launcher the interpreter), so the device does not wait.
LEAD_MIN_S, LEAD_SHARE = 1e-3, 0.25
# A build's next step waits at most this long, after its last one, for the queries and jobs that waited meanwhile
# (a health probe, above all) to be launched; then no batch is launched until it has run.
GIVE_S = 0.05
# Steps of a build run back to back while their turn is shorter than this: a step this short costs the queries less
# than a drain of the batches in flight would cost the build; longer turns would add to a query's wait.
SLICE_S = 0.005


class Observer(Protocol):
    """What the worker reports (qcls.deployments.metrics.ReplicaMetrics records it for Prometheus)."""

    def after_batch(self, results: list[QueryResult]) -> None: ...

    def engine_error(self, kind: str) -> None: ...


@dataclass
class Pending:
    """One query waiting for a batch; `arrived` (perf_counter) is when its request reached the replica; `clf`
    the Classifier active when it was queued (set by `submit`): a reload swaps the active one, and the queries
    queued before the swap still run on theirs."""

    query: str
    arrived: float
    clf: Classifier | None = None


class EngineWorker(HealthChecks):
    def __init__(self, clf: Classifier, probe_idle_s: float = 60.0, probe_timeout_s: float = 20.0,
                 observer: Observer | None = None, depth: int = 2, fill_while_busy: bool = True):
        self.clf = clf
        self.observer = observer
        self.max_batch = clf.cfg.engine.max_batch_size
        self._init_health(probe_idle_s, probe_timeout_s)
        # Two threads own the device, never the replica's event loop (which keeps answering health checks and
        # taking requests meanwhile). The launcher takes the next batch as soon as fewer than `depth` are in
        # flight, tokenizes it and queues its forward behind the running one; the collector waits for each
        # forward in turn, builds its results and hands them back. With depth 2 the host's work on one batch
        # overlaps the device's on the other; depth 1 runs one batch at a time. With fill_while_busy, a batch
        # that would queue behind a running one waits to fill (up to max_batch queries) until shortly before
        # the running one should end, by the device times measured so far: fuller batches at no latency cost,
        # since the device is busy meanwhile. An idle device takes a lone query at once either way.
        self.depth, self.fill_while_busy = depth, fill_while_busy
        # batch size → its device time (forward + score): measured at start-up, then a running mean
        self._device_s = {b: ms / 1e3 for b, ms in clf.device_ms.items()}
        self._busy_until = 0.0  # perf_counter when the device should be done with every launched batch
        self._launch_by = 0.0  # perf_counter by which the next batch should be on its way to the device
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # the launcher waits here: queries, jobs or a free slot
        self._ready = threading.Condition(self._lock)  # the collector waits here: a launched batch
        self._waiting: deque[tuple[Pending, asyncio.Future, asyncio.AbstractEventLoop]] = deque()
        self._jobs: deque[tuple[Callable, tuple, Future]] = deque()  # probes and run_batch calls, first
        self._launched: deque[tuple[list, object, float]] = deque()  # (chunk, started batch, launch time)
        self._inflight = 0  # batches launched and not yet answered, jobs included
        # builds whose steps run here, one at a time, each step with nothing else on the device (run_steps)
        self._builds: deque[tuple[Generator, Future, list]] = deque()
        self._step_at = 0.0  # monotonic time by which the next build step runs even if queries wait
        self.give_s, self.slice_s = GIVE_S, SLICE_S
        self._closed = False
        threading.Thread(target=self._launch_loop, name="qcls-launch", daemon=True).start()
        threading.Thread(target=self._collect_loop, name="qcls-collect", daemon=True).start()

    # -- queries -----------------------------------------------------------------------------------------

    def submit(self, items: list[Pending]) -> list[asyncio.Future]:
        """Queue queries for the device; each future resolves to its QueryResult.

        A query that finds the device idle starts at once. Queries that arrive while a forward runs wait
        here, and the next forward takes up to engine.max_batch_size of them together (whichever request or
        @serve.batch call they came from): batches fill from the load itself, with no timer."""
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in items]
        with self._lock:
            for it in items:
                it.clf = it.clf or self.clf
            self._waiting.extend((it, fut, loop) for it, fut in zip(items, futures))
            self._work.notify()
        return futures

    def run_steps(self, steps: Generator) -> Any:
        """Run `steps` (a reload's Classifier.in_steps, a release of memory: device work that must not run beside a
        batch) on the launcher, one step at a time between batches: each step with no batch in flight and none
        launched, and between two steps the queries and jobs that waited meanwhile. Blocks the calling thread until
        the last step; returns the generator's value, or raises what a step raised."""
        done: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the replica is shutting down")
            if not self._builds:
                self._step_at = time.monotonic() + self.give_s
            self._builds.append((steps, done, []))  # [] gathers (seconds, name) per step
            self._work.notify()
        return done.result()

    def _launch_loop(self) -> None:
        while True:
            with self._lock:
                build = False
                while not self._closed:
                    due = self._step_due()
                    if due == 0.0:  # a build step: the batches in flight end first, nothing new is launched
                        if self._inflight == 0:
                            build = True
                            break
                        self._work.wait()
                        continue
                    free = self._inflight < self.depth
                    hold = self._hold_s() if free and self._waiting else None
                    if free and (self._jobs or (hold is not None and hold <= 0)):
                        break
                    waits = [t for t in (hold, due) if t is not None]
                    self._work.wait(min(waits) if waits else None)  # None: until notified
                if self._closed:
                    return self._end_builds()
                job = self._jobs.popleft() if self._jobs and not build else None
                chunk = [] if job or build else self._take()
                if job or chunk:
                    self._inflight += 1
            if build:
                self._build_turn()
            elif job is not None:
                fn, args, done = job
                if done.set_running_or_notify_cancel():
                    try:
                        with self._device_step("launch"):
                            done.set_result(fn(*args))
                    except BaseException as e:  # noqa: BLE001 - handed to the awaiting caller
                        done.set_exception(e)
                self._settled()
            elif chunk:
                started = time.perf_counter()
                with self._device_step("launch"):
                    batch = self._start([it.query for it, _, _ in chunk], chunk[0][0].clf)
                with self._lock:
                    self._launched.append((chunk, batch, started))
                    self._ready.notify()
                    device_s = self._device_s.get(len(chunk), 0.0)
                    self._busy_until = max(time.perf_counter(), self._busy_until) + device_s
                    self._launch_by = self._busy_until - max(LEAD_MIN_S, LEAD_SHARE * device_s)
            # an idle replica must not keep the last batch's Classifier alive: after a reload, the replaced one
            chunk = batch = job = None

    def _step_due(self) -> float | None:
        """Seconds until a build's next step runs: None without a build, 0.0 when due (nothing waits, or the
        queries that waited had their GIVE_S)."""
        if not self._builds:
            return None
        if not (self._waiting or self._jobs):
            return 0.0
        return max(0.0, self._step_at - time.monotonic())

    def _build_turn(self) -> None:
        """One turn of the first build: its next step, and more while the turn is shorter than SLICE_S."""
        steps, done, took = self._builds[0]
        turn, end = time.monotonic(), None
        with self._device_step("launch"):
            while end is None:
                t0 = time.perf_counter()
                try:
                    name = next(steps)
                except StopIteration as stop:
                    end, name = (stop.value, None), "the last step"
                except BaseException as e:  # noqa: BLE001 - handed to the caller of run_steps
                    end, name = (None, e), "a failed step"
                took.append((time.perf_counter() - t0, name))
                if time.monotonic() - turn >= self.slice_s:
                    break
        with self._lock:
            self._step_at = time.monotonic() + self.give_s
            if end is not None:
                self._builds.popleft()
        if end is not None:
            top = sorted(took, key=lambda t: -t[0])[:3]
            # a graph capture is the one step that cannot be cut finer: the floor of what a step costs the queries
            capture = max((t for t in took if str(t[1]).endswith("graph captured")), key=lambda t: t[0], default=None)
            log.warning("device owner: a build of %d steps, %.2f s on the device; its longest step %.1f ms (%s); "
                        "then %s%s", len(took), sum(t for t, _ in took), top[0][0] * 1e3, top[0][1],
                        ", ".join(f"{t * 1e3:.1f} ms ({name})" for t, name in top[1:]) or "none",
                        f"; its longest graph capture {capture[0] * 1e3:.1f} ms ({capture[1]})" if capture else "")
            if end[1] is not None:
                done.set_exception(end[1])
            else:
                done.set_result(end[0])
        steps = done = end = None  # (the built Classifier lives on in the caller, not in this frame)

    def _end_builds(self) -> None:
        while self._builds:
            steps, done, _ = self._builds.popleft()
            steps.close()
            done.set_exception(RuntimeError("the replica is shutting down"))

    def _hold_s(self) -> float:
        """How much longer the waiting queries may gather before their batch is launched: none when the device
        is idle or a full batch waits; else until shortly before the batch in flight should end."""
        if not self.fill_while_busy or self._inflight == 0 or len(self._waiting) >= self.max_batch:
            return 0.0
        return self._launch_by - time.perf_counter()

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
            else:
                self._learn(answer)
            self._settled()
            for loop in {lp for _, _, lp in chunk}:
                mine = [(i, fut) for i, (_, fut, lp) in enumerate(chunk) if lp is loop]
                try:
                    loop.call_soon_threadsafe(self._deliver, mine, answer)
                except RuntimeError:  # that caller's event loop is gone
                    pass
            chunk = batch = mine = None  # (as in the launcher: nothing of the last batch outlives it)

    def _learn(self, results: list[QueryResult]) -> None:
        """Update the running mean of the device time of this batch size (a forward's time barely varies)."""
        t = next((r.timings_ms for r in results if r.ok and "forward" in r.timings_ms), None)
        if t is not None:
            b, s = results[0].batch_size or len(results), (t["forward"] + t.get("score", 0.0)) / 1e3
            self._device_s[b] = s if b not in self._device_s else 0.8 * self._device_s[b] + 0.2 * s

    def _settled(self) -> None:
        with self._lock:
            self._inflight -= 1
            self._work.notify()

    def _take(self) -> list:
        """The next batch: up to max_batch waiting queries of one Classifier (those queued before a reload
        form the last batches of the old one)."""
        chunk = []
        while self._waiting and len(chunk) < self.max_batch:
            if chunk and self._waiting[0][0].clf is not chunk[0][0].clf:
                break
            item = self._waiting.popleft()
            if not item[1].done():  # a cancelled request gives up its slot
                chunk.append(item)
        return chunk

    def swap(self, clf: Classifier) -> None:
        """Make `clf` (built beside the active one on the same weights) answer the queries queued from now on;
        batches launched or queued before finish on the old one, which is dropped once they are answered."""
        with self._lock:
            self.clf = clf
            self._device_s = {b: ms / 1e3 for b, ms in clf.device_ms.items()}

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

    def classify_batch(self, items: list[Pending]) -> list[QueryResult]:
        """One batch in one forward, started and finished here (tests, probes and callers that batch
        themselves; served queries take the same two steps on the launcher and collector threads)."""
        started = time.perf_counter()
        clf = items[0].clf if items and items[0].clf is not None else self.clf
        return self._finish(items, self._start([it.query for it in items], clf), started)

    async def run_batch(self, items: list[Pending]) -> list[QueryResult]:
        """classify_batch on the launcher thread (a job between batches), awaited (tests, and callers that
        batch themselves)."""
        return await self._on_device(self.classify_batch, items)

    async def _on_device(self, fn, *args):
        done: Future = Future()
        with self._lock:
            self._jobs.append((fn, args, done))
            self._work.notify()
        return await asyncio.wrap_future(done)

    def close(self) -> None:
        """Stop the device threads once the batches in flight are answered (Serve calls this once the
        replica drained)."""
        with self._lock:
            self._closed = True
            self._work.notify_all()
            self._ready.notify_all()
