"""bench/tails.py: the slowest requests' split and their overlap with GC pauses, against values worked out by
hand; and the GcPauses recorder they are built on."""
from __future__ import annotations

import gc

import pytest

from bench.paths import Level
from bench.tails import gc_delta, tail


def level() -> Level:
    # 300 rows: (client ms, batch, engine ms, queue ms), answered at `ends` (s). The 3 slowest (1 % of 300,
    # at least 3) are 30, 40 and 50 ms long; the rest 10 ms.
    lv = Level("http", 8)
    for i in range(297):
        lv.rows.append((10.0, 4, 8.0, 1.0))
        lv.ends.append(100.0 + i * 0.01)
    for ms, end in ((30.0, 200.0), (40.0, 201.0), (50.0, 202.0)):
        lv.rows.append((ms, 4, 9.0, ms - 20.0))
        lv.ends.append(end)
    return lv


def test_tail_splits_the_slowest_percent_by_hand():
    # by hand: mean ms (30+40+50)/3 = 40; queue (10+20+30)/3 = 20; engine 9; serving 40-9-20 = 11.
    # Replica pauses: one of 5 ms starting at 199.99 s (overlaps the request [199.97, 200.0]), one of 0.5 ms
    # inside the 40 ms request (under PAUSE_MS: ignored), one of 2 ms at 150 s (overlaps no slow request).
    replica = {"recent": [(199.99, 5.0, 2), (200.98, 0.5, 0), (150.0, 2.0, 1)]}
    client = {"recent": [(201.955, 1.0, 0)]}  # inside the 50 ms request [201.95, 202.0]
    t = tail(level(), replica, client)
    assert t == {"n": 3, "ms": 40.0, "queue": 20.0, "engine": 9.0, "serving": 11.0, "replica_gc": 1, "client_gc": 1}


def test_gc_delta_counts_only_the_window():
    before = {"count": [10, 2, 1], "total_ms": [1.0, 0.5, 3.0], "max_ms": [0, 0, 0], "recent": []}
    after = {"count": [14, 3, 1], "total_ms": [1.6, 2.5, 3.0], "max_ms": [0, 0, 0],
             "recent": [(5.0, 9.0, 2), (10.5, 0.2, 0), (11.0, 1.5, 1), (12.5, 0.1, 0)]}
    d = gc_delta(before, after, 10.0, 12.0)
    assert d["count"] == [4, 1, 0] and d["total_ms"] == pytest.approx(2.6)
    assert d["max_ms"] == 1.5 and d["long"] == 1 and d["recent"] == [(10.5, 0.2, 0), (11.0, 1.5, 1)]


def test_gc_pauses_records_each_collection_by_generation():
    pytest.importorskip("ray", reason="GcPauses lives in qcls.deployments.metrics, which needs ray[serve]: pip install -e '.[serve]'")
    from qcls.deployments.metrics import GcPauses

    rec = GcPauses()
    try:
        gc.collect(1)
        gc.collect(2)
        assert rec.count[1] >= 1 and rec.count[2] >= 1
        gens = [g for _t, _ms, g in rec.recent]
        assert 1 in gens and 2 in gens and all(ms >= 0 for _t, ms, _g in rec.recent)
    finally:
        rec.close()
    n = sum(rec.count)
    gc.collect()
    assert sum(rec.count) == n  # closed: no longer called
