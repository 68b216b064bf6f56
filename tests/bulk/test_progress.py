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
