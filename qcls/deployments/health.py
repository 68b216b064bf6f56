"""A replica's health: a batch that makes the engine raise fails only the queries that raise (its queries are
retried one by one) and makes the engine suspect; the health checks decide when a real forward is worth running,
when a stuck device step is evidence enough, and what gets logged before Serve replaces the replica (every thread's
stack: the replaced process leaves nothing else to tell where its threads were stuck). A mixin of EngineWorker,
whose threads mark their device steps."""
from __future__ import annotations

import asyncio
import logging
import math
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from typing import TYPE_CHECKING

from qcls.classifier import WARMUP_QUERY, Classifier
from qcls.results.requests import failed, finish_batch, start_batch
from qcls.results import QueryResult

if TYPE_CHECKING:
    from qcls.deployments.worker import Pending

log = logging.getLogger("qcls.serve")


class HealthChecks:
    """Needs `clf`, `observer` and `_on_device` (run a function on the launcher thread between batches) from the
    worker; `_init_health` sets the rest."""

    def _init_health(self, probe_idle_s: float, probe_timeout_s: float) -> None:
        self.probe_idle_s, self.probe_timeout_s = probe_idle_s, probe_timeout_s
        self.last_ok = time.monotonic()
        self.suspect: str | None = None  # an engine error since the last good forward: probe before trusting
        self.broken: str | None = None  # the probe failed: this replica cannot serve and must be replaced
        # thread name → when its current device step (a launch, a job, a wait for a forward's end) began; a step
        # older than a probe may take fails the health check (off while a test holds the forwards on purpose)
        self._step_since: dict[str, float] = {}
        self.watch_steps = True

    @contextmanager
    def _device_step(self, thread: str):
        self._step_since[thread] = time.monotonic()
        try:
            yield
        finally:
            del self._step_since[thread]

    async def check(self) -> None:
        """Raise if the engine cannot answer. A real forward runs only after an engine error or a long idle
        spell: with traffic flowing, recent successes are the evidence and the check costs nothing. A device
        step (a batch's launch, the wait for its end) that has not returned for longer than a probe may take
        fails the check at once: under load the successes stop, but the idle spell that starts a probe never
        comes while requests keep arriving."""
        if self.broken:
            raise RuntimeError(f"engine unusable: {self.broken}")
        held = max((time.monotonic() - t for t in list(self._step_since.values())), default=0.0)
        if held > self.probe_timeout_s and self.watch_steps:
            self._unusable(f"a device step has not returned for {held:.0f}s", stacks=True)
        if self.suspect is None and time.monotonic() - self.last_ok < self.probe_idle_s:
            return
        try:
            await asyncio.wait_for(self._on_device(self._probe), self.probe_timeout_s)
        except Exception as e:
            timeout = isinstance(e, TimeoutError)
            self._unusable(f"no answer within {self.probe_timeout_s:g}s" if timeout else f"{type(e).__name__}: {e}",
                           stacks=timeout)
        self.suspect = None
        self._ok()

    def _unusable(self, reason: str, stacks: bool) -> None:
        if stacks:  # where the device threads (and a reload's build) are stuck
            log.error("health probe: %s; every thread's stack:\n%s", reason, thread_stacks())
        self.broken = f"health probe failed ({reason}); last engine error: {self.suspect}"
        self._report("unusable")
        raise RuntimeError(f"engine unusable: {self.broken}") from None

    def _probe(self) -> None:
        r = self.clf.classify([WARMUP_QUERY])[0]
        if not r.ok:
            raise RuntimeError(r.error)
        bad = [p.prompt for p in r.prompts if not all(math.isfinite(s.prob) for s in p.labels)]
        if bad:
            raise RuntimeError(f"non-finite scores for prompts {bad}")

    def _start(self, queries: list[str], clf: Classifier):
        """(clf, the started batch | the answers already known (engine unusable) | the exception starting
        raised)."""
        if self.broken:
            return clf, [failed(q, f"engine unusable: {self.broken}") for q in queries]
        return clf, start_batch(clf, queries)

    def _finish(self, items: list[Pending], batch, started: float) -> list[QueryResult]:
        """Results of a started batch; a query that makes the engine raise fails alone, and the engine is suspect
        until a probe answers. queue_wait = arrival at the replica to the batch's launch, plus the time its forward
        waited for the device."""
        clf, batch = batch
        if isinstance(batch, list):
            results = batch
        else:
            results = finish_batch(clf, [it.query for it in items], batch, self._failed, wait_is_queue=True)
            if any(r.ok for r in results):
                self._ok()
        for it, r in zip(items, results):
            waited = r.timings_ms.pop("device_wait", 0.0)
            r.timings_ms["queue_wait"] = round((started - it.arrived) * 1e3 + waited, 4)
        return results

    def _failed(self, kind: str, e: Exception) -> None:
        if kind == "batch":
            self.suspect = f"{type(e).__name__}: {e}"
        self._report(kind)

    def _report(self, kind: str) -> None:
        if self.observer is not None:
            self.observer.engine_error(kind)

    def _ok(self) -> None:
        self.last_ok = time.monotonic()


def thread_stacks() -> str:
    """Every thread's Python stack, innermost call last."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        out.append(f"--- thread {names.get(ident, '?')} ({ident}), innermost call last:")
        out.extend(line.rstrip("\n") for line in traceback.format_stack(frame))
    return "\n".join(out)
