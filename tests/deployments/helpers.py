"""Comparisons between served results (HTTP dicts or handle dataclasses) and `Classifier.classify`, and the
Ray tests' waits for events (a request in flight on a held replica, a process gone) instead of times."""
from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import asdict
from pathlib import Path

import pytest

from qcls.results import QueryResult



# Replica and test process differ in thread count (reduction order) and a batch in bucket shape.
TOL = dict(rel=1e-4, abs=1e-4)


def as_dict(r) -> dict:
    return asdict(r) if isinstance(r, QueryResult) else r


def assert_same(served, local: QueryResult) -> None:
    s, ref = as_dict(served), asdict(local)
    assert s["query"] == ref["query"]
    assert s["error"] == ref["error"]
    assert s["query_tokens"] == ref["query_tokens"]
    assert [p["prompt"] for p in s["prompts"]] == [p["prompt"] for p in ref["prompts"]]
    for sp, rp in zip(s["prompts"], ref["prompts"]):
        assert sp["label"] == rp["label"], (s["query"], sp["prompt"])
        assert sp["prob"] == pytest.approx(rp["prob"], **TOL)
        assert [lab["label"] for lab in sp["labels"]] == [lab["label"] for lab in rp["labels"]]
        scores = [lab["score"] for lab in rp["labels"]]
        if None in scores:  # the forward stopped at the heads' layer: no label scores, on either side
            assert [lab["score"] for lab in sp["labels"]] == scores
        else:
            assert [lab["score"] for lab in sp["labels"]] == pytest.approx(scores, **TOL)
        assert [lab["prob"] for lab in sp["labels"]] == pytest.approx([lab["prob"] for lab in rp["labels"]], **TOL)
        assert [lab["tokens"] for lab in sp["labels"]] == [lab["tokens"] for lab in rp["labels"]]


def assert_no_trace(text: str) -> None:
    assert "Traceback" not in text and 'File "' not in text, text


# A hang guard, not a bound: how long a test waits for something that must happen before calling it a hang.
# Every wait below is for an event (a query reached the replica, a process exited), never for a time.
HANG_GUARD_S = 120.0


def until(done, what: str, guard_s: float = HANG_GUARD_S, every_s: float = 0.05):
    """Poll `done()` until it returns something true, and return that; fail after guard_s (a hang guard)."""
    deadline = time.monotonic() + guard_s
    while not (got := done()):
        if time.monotonic() > deadline:
            pytest.fail(f"waited {guard_s:g} s (hang guard) for {what}")
        time.sleep(every_s)
    return got


async def until_async(done, what: str, guard_s: float = HANG_GUARD_S, every_s: float = 0.05):
    deadline = time.monotonic() + guard_s
    while not (got := done()):
        if time.monotonic() > deadline:
            pytest.fail(f"waited {guard_s:g} s (hang guard) for {what}")
        await asyncio.sleep(every_s)
    return got


class Hold:
    """The forwards of the replica a handle call reaches, held (inject_fault "hold") until release(): a
    request that reaches it stays in flight there, and arrived() lists the queries that have, so a test waits
    for an event instead of sleeping and hoping that the request got there in time."""

    def __init__(self, handle, tmp: Path, guard_s: float = HANG_GUARD_S):
        self.handle, self.path = handle, tmp / f"release-{uuid.uuid4().hex[:8]}"
        self.pid = handle.inject_fault.remote("hold", seconds=guard_s, path=str(self.path)).result()

    def arrived(self) -> list[str]:
        f = Path(f"{self.path}.arrived")
        return f.read_text(encoding="utf-8").splitlines() if f.exists() else []

    def release(self) -> None:
        self.path.touch()

    def undo(self) -> None:
        """Release, and take the fault off (reaches the replica that the handle call reaches: the only one
        of a one-replica app)."""
        self.release()
        self.handle.inject_fault.remote(None).result()
