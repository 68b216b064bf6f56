"""Faults injected into a serving replica on purpose, for the tests of what a failure does (a broken device, a
poisoned batch, a slow or held forward, a replica killed while requests are in flight).

The deployment's `inject_fault` handle call (qcls/deployments/app.py) calls `inject`, and only where the config
says serve.fault_injection=true; the wheel does not ship this module, so a served deployment never has it.

    pid = handle.inject_fault.remote("hold", seconds=60, path="/tmp/release").result()   # this replica's pid
    handle.inject_fault.remote(None).result()                                             # undone
"""
from __future__ import annotations

import os
import time

INJECTED_CUDA_ERROR = "CUDA error: an illegal memory access was encountered (injected by inject_fault)"
KINDS = ("engine", "poison", "slow", "hold")


def inject(clf, worker, kind: str | None, query: str | None = None, seconds: float = 0.0,
           path: str | None = None) -> None:
    """Into a replica's Classifier `clf` and EngineWorker `worker`. kind="engine": every forward raises a
    CUDA-like error; "poison": only batches holding `query` raise; "slow": every forward takes `seconds` longer;
    "hold": every forward waits until the file `path` exists (at most `seconds`, a hang guard) and every query
    that reaches this replica is written, one a line, to `path`.arrived, so that a test knows from events, not
    from times, that requests are in flight here; None: undo."""
    for obj, name in ((clf.engine, "launch"), (clf, "_launch"), (worker, "submit")):
        obj.__dict__.pop(name, None)
    worker.watch_steps = kind != "hold"  # a held forward is the test's doing, not a stuck device
    if kind == "engine":
        def broken_launch(*_a, **_k):
            raise RuntimeError(INJECTED_CUDA_ERROR)
        clf.engine.launch = broken_launch
    elif kind == "poison":  # Classifier._launch: under both the served path (start) and classify
        real = clf._launch

        def poisoned(results, good):
            if any(results[i].query == query for i, _, _ in good):
                raise RuntimeError(f"injected failure on {query!r}")
            return real(results, good)
        clf._launch = poisoned
    elif kind == "slow":
        real = clf._launch

        def slow(results, good):
            time.sleep(seconds)
            return real(results, good)
        clf._launch = slow
    elif kind == "hold":
        if not path:
            raise ValueError("inject_fault('hold') needs path= (the file whose creation releases the forwards)")
        real, real_submit = clf._launch, worker.submit

        def held(results, good):
            deadline = time.monotonic() + seconds
            while not os.path.exists(path) and time.monotonic() < deadline:
                time.sleep(0.005)
            return real(results, good)

        def noted(items):
            with open(f"{path}.arrived", "a", encoding="utf-8") as f:
                f.writelines(f"{it.query}\n" for it in items)
            return real_submit(items)
        clf._launch, worker.submit = held, noted
    elif kind is not None:
        raise ValueError(f"unknown fault {kind!r}: use {', '.join(map(repr, KINDS))} or None")
