"""A replica's health probes: when a real forward is worth running (after an engine error or a long idle spell), when a
stuck device step is evidence enough, and what gets logged before Serve replaces the replica (every thread's stack: the
replaced process leaves nothing else to tell where its threads were stuck). A mixin of EngineWorker: its step() runs a
probe between batches (`_run_probe`), its batches report engine errors and good forwards here, and its threads mark
their device steps (`_device_step`)."""
from __future__ import annotations

import asyncio
import logging
import math
import sys
import threading
import time
import traceback
from concurrent.futures import Future
from contextlib import contextmanager

from qcls.classifier import WARMUP_QUERY

log = logging.getLogger("qcls.serve")


class HealthChecks:
    """Needs `clf`, `observer`, `_lock`, `_work`, `_probes` and `_settled` from the worker; `_init_health` sets the
    rest."""

    def _init_health(self, probe_idle_s: float, probe_timeout_s: float) -> None:
        self.probe_idle_s, self.probe_timeout_s = probe_idle_s, probe_timeout_s
        self.last_ok = time.monotonic()
        self.suspect: str | None = None  # an engine error since the last good forward: probe before trusting
        self.broken: str | None = None  # the probe failed: this replica cannot serve and must be replaced
        # thread name → when its current device step (a launch, a probe, a build step, a wait for a forward's end)
        # began; one older than a probe may take fails the health check (off while a test holds forwards on purpose)
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
            await asyncio.wait_for(asyncio.wrap_future(self._ask_probe()), self.probe_timeout_s)
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

    def _ask_probe(self) -> Future:
        """A probe, run by the worker's step() between batches."""
        done: Future = Future()
        with self._lock:
            self._probes.append(done)
            self._work.notify()
        return done

    def _run_probe(self, done: Future) -> None:
        if done.set_running_or_notify_cancel():  # (not once the check stopped waiting)
            try:
                with self._device_step("launch"):
                    done.set_result(self._probe())
            except BaseException as e:  # noqa: BLE001 - handed to the waiting check
                done.set_exception(e)
        self._settled()

    def _probe(self) -> None:
        r = self.clf.classify([WARMUP_QUERY])[0]
        if not r.ok:
            raise RuntimeError(r.error)
        bad = [p.prompt for p in r.prompts if not all(math.isfinite(s.prob) for s in p.labels)]
        if bad:
            raise RuntimeError(f"non-finite scores for prompts {bad}")

    def _engine_error(self, kind: str, e: Exception) -> None:
        """A batch whose forward raised ("batch") makes the engine suspect until a probe answers; then each query
        that raised on its own ("query")."""
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
