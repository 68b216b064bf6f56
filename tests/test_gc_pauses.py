"""GcPauses: this process's garbage-collector pauses by generation, as a replica's `replica_stats()["gc"]` reports
them."""
from __future__ import annotations

import gc

from qcls.gc_pauses import GcPauses


def test_gc_pauses_records_each_collection_by_generation():
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
