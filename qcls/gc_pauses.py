"""The garbage collector's pauses in this process, by generation: what a serving replica exports
(`ray_qcls_gc_pause_ms`, qcls/deployments/metrics.py) and reports (`replica_stats()["gc"]`) to line its pauses up
with a client's slowest requests."""
from __future__ import annotations

import gc
import time
from collections import deque


class GcPauses:
    """The garbage collector's pauses in this process. A collection holds the GIL, so every thread of a
    replica (event loop, launcher, collector) waits it out: a long one is a latency spike for every request
    in flight. Recorded from gc.callbacks; `recent` keeps the latest (perf_counter at start, ms, generation)."""

    def __init__(self, keep: int = 512):
        self.recent: deque[tuple[float, float, int]] = deque(maxlen=keep)
        self.count, self.total_ms, self.max_ms = [0, 0, 0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]
        self._started = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._started = now
            return
        g, ms = info["generation"], (now - self._started) * 1e3
        self.count[g] += 1
        self.total_ms[g] += ms
        self.max_ms[g] = max(self.max_ms[g], ms)
        self.recent.append((self._started, ms, g))

    def summary(self) -> dict:
        return {"count": list(self.count), "total_ms": [round(x, 3) for x in self.total_ms],
                "max_ms": [round(x, 3) for x in self.max_ms], "recent": list(self.recent)}

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
