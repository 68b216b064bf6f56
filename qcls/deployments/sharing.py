"""The replica's side of the device turns (qcls/engine/turns.py): a reload's build holds the device while no
batch is in flight and none is launched, and gives way between its steps to the queries that waited. A mixin
of EngineWorker: its launcher launches nothing while a build holds the device."""
from __future__ import annotations

import threading
import time

# What a build waits, when it takes the device back, for the queries and jobs that waited meanwhile to be launched.
GIVE_S = 0.05
# A build's give_way that comes sooner than this after it took the device keeps it: a step this short costs
# the queries less than a drain of the batches in flight would cost the build.
SLICE_S = 0.02


class DeviceSharing:
    """Needs the worker's `_lock`, `_work` (the launcher's condition), `_waiting`, `_inflight` and `_closed`;
    `_init_sharing` sets the rest. The worker notifies `_turn` whenever a query is taken or a batch settles."""

    def _init_sharing(self) -> None:
        self._held = 0  # builds holding the device (one at a time: the Reloader builds one at a time)
        self._turn = threading.Condition(self._lock)
        self._held_since = 0.0
        self.give_s, self.slice_s = GIVE_S, SLICE_S

    def hold_device(self) -> None:
        with self._lock:
            end = time.monotonic() + self.give_s
            # the queries and jobs (a health probe, above all) that waited meanwhile go first
            while (self._waiting or self._jobs) and not self._closed and (left := end - time.monotonic()) > 0:
                self._turn.wait(left)
            self._held += 1
            while self._inflight:  # (a closed worker still answers what it launched)
                self._turn.wait()
        self._held_since = time.monotonic()

    def give_way(self) -> None:
        if time.monotonic() - self._held_since < self.slice_s:
            return
        self.release_device()
        self.hold_device()

    def release_device(self) -> None:
        with self._lock:
            self._held -= 1
            self._work.notify()
