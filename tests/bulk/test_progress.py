"""The progress line (a line every few seconds when stderr is not a terminal, nothing with --quiet) and the
summary's counts, rates and label distribution."""
from __future__ import annotations

import io
from collections import Counter

from qcls.bulk.progress import Progress, Tally, format_summary, summary


def test_log_lines_when_not_a_terminal_and_quiet():
    t = Tally(rows=10, classified=4)
    out = io.StringIO()
    p = Progress(t, lambda: 0.5, out=out, log_every_s=3600)
    p.tick()
    assert out.getvalue() == ""  # not yet due
    p.tick(force=True)
    line = out.getvalue()
    assert line.endswith("\n") and "10 rows" in line and "4 distinct classified" in line and "50% read" in line
    q = io.StringIO()
    Progress(t, out=q, quiet=True).tick(force=True)
    assert q.getvalue() == ""


def test_summary_counts_rates_and_labels():
    t = Tally(rows=100, classified=20, cached=70, errors=Counter(empty=6, too_long=4),
              labels={"category": Counter(dress=60, jeans=30)})
    extra = Tally(rows=10, classified=5, labels={"category": Counter(dress=10)})
    t.merge(extra)
    d = summary(t, 2.0, 5.0)
    assert (d["rows"], d["classified"], d["rows_per_s"], d["distinct_per_s"], d["repeat_ratio"]) == (110, 25, 55.0,
                                                                                                     12.5, 4.4)
    text = format_summary(d)
    assert "dress 70.0%" in text and "jeans 30.0%" in text and '"too_long": 4' in text and "5.0 s start-up" in text


def test_summary_of_a_ray_run_names_each_actor():
    d = summary(Tally(rows=30, classified=9), 3.0, 1.0, {
        "actors": 2, "shuffle": True, "actor_restarts": 1, "pool_full_s": 2.5,
        "per_actor": [{"pid": 11, "gpus": ["0"], "ready_s": 1.0, "calls": 3, "rows": 20, "classified": 6,
                       "busy_share": 0.9},
                      {"pid": 12, "gpus": [], "ready_s": 2.5, "calls": 1, "rows": 10, "classified": 3,
                       "busy_share": 0.25}]})
    text = format_summary(d)
    assert "2 actors, pool full at 2.5 s, rows sorted by query hash" in text and "1 restarts" in text
    assert "actor 11 (GPU 0, ready at 1.0 s): 3 calls, 20 rows, 6 classified, busy 90% of the run" in text
    assert "actor 12 (GPU none, ready at 2.5 s): 1 calls, 10 rows, 3 classified, busy 25% of the run" in text
    d.update(pool_full_s=None, actors_ready=1)  # a small input: done before the second actor was ready
    assert "2 actors, 1 of 2 ready before the input ran out, rows sorted" in format_summary(d)
