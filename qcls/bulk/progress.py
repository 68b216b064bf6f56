"""What a bulk run counts, the progress line on stderr and the summary at the end.

On a terminal the line is redrawn in place (rows/s, distinct/s, ETA) at most twice a second; when stderr is
not a terminal (a log file, CI) a plain line goes out every `log_every_s` seconds instead; --quiet prints
neither (the summary still comes back to the caller as a dict).
"""
from __future__ import annotations

import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, TextIO


ABSTAINED = "(abstained)"  # the summary's count of rows where a prompt gave no label (below its threshold)


@dataclass
class Tally:
    """Counts of a run (or of one Ray actor's share; `merge` adds them up)."""

    rows: int = 0
    classified: int = 0  # distinct queries sent to the engine (a query evicted from the cache and seen again counts twice)
    cached: int = 0  # rows answered from the cache or from an earlier row of their chunk
    errors: Counter = field(default_factory=Counter)  # kind → rows
    labels: dict[str, Counter] = field(default_factory=dict)  # prompt → label → rows
    resumed_rows: int = 0  # rows found done in part files of an interrupted run
    dropped_keys: int = 0  # JSONL rows with keys beyond the first object's (not in a CSV/Parquet output)

    def count_result(self, prompts: list[str], labels: tuple[str, ...]) -> None:
        counts = self.labels
        for p, lab in zip(prompts, labels):
            c = counts.get(p)
            if c is None:  # (setdefault's default argument would build a Counter per row and prompt)
                c = counts[p] = Counter()
            c[lab if lab is not None else ABSTAINED] += 1

    def merge(self, other: "Tally") -> None:
        for k in ("rows", "classified", "cached", "resumed_rows", "dropped_keys"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        self.errors.update(other.errors)
        for p, c in other.labels.items():
            self.labels.setdefault(p, Counter()).update(c)

    def as_dict(self) -> dict:
        return {"rows": self.rows, "classified": self.classified, "cached": self.cached,
                "errors": dict(self.errors), "labels": {p: dict(c.most_common()) for p, c in self.labels.items()},
                "resumed_rows": self.resumed_rows, "dropped_keys": self.dropped_keys}


class Progress:
    """The progress line. `fraction` says how much of the input is read (for the ETA)."""

    def __init__(self, tally: Tally, fraction: Callable[[], float] | None = None, quiet: bool = False,
                 out: TextIO | None = None, log_every_s: float = 10.0):
        self.tally, self.fraction = tally, fraction
        self.out = out or sys.stderr
        self.quiet = quiet
        self.tty = (not quiet) and self.out.isatty()
        self.every = 0.5 if self.tty else log_every_s
        self.t0 = time.perf_counter()
        self._last = self.t0

    def restart_clock(self) -> None:
        """Rates count from here (after start-up)."""
        self.t0 = self._last = time.perf_counter()

    def line(self) -> str:
        t = self.tally
        dt = max(1e-9, time.perf_counter() - self.t0)
        done = t.rows - t.resumed_rows
        text = (f"[qcls bulk] {t.rows:,} rows · {t.classified:,} distinct classified · {done / dt:,.0f} rows/s · "
                f"{t.classified / dt:,.1f} distinct/s · {sum(t.errors.values()):,} errors")
        frac = self.fraction() if self.fraction else None
        if frac and 0 < frac < 1:
            text += f" · {frac:.0%} read · ETA {_hms(dt * (1 - frac) / frac)}"
        return text

    def tick(self, force: bool = False) -> None:
        if self.quiet:
            return
        now = time.perf_counter()
        if not force and now - self._last < self.every:
            return
        self._last = now
        if self.tty:
            self.out.write("\r\x1b[K" + self.line())
        else:
            self.out.write(self.line() + "\n")
        self.out.flush()

    def close(self) -> None:
        if self.tty:
            self.out.write("\n")
            self.out.flush()


def summary(tally: Tally, seconds: float, startup_s: float, extra: dict | None = None) -> dict:
    """The run's summary: counts, rates over the classifying time (start-up apart), per prompt the labels."""
    d = tally.as_dict()
    done = tally.rows - tally.resumed_rows
    d.update(seconds=round(seconds, 3), startup_s=round(startup_s, 3),
             rows_per_s=round(done / seconds, 1) if seconds > 0 else None,
             distinct_per_s=round(tally.classified / seconds, 1) if seconds > 0 else None,
             repeat_ratio=round(tally.rows / tally.classified, 3) if tally.classified else None, **(extra or {}))
    return d


def format_summary(d: dict) -> str:
    lines = [f"[qcls bulk] done: {d['rows']:,} rows ({d['resumed_rows']:,} from an earlier run), "
             f"{d['classified']:,} distinct queries classified (rows / distinct {d['repeat_ratio']}), "
             f"{d['cached']:,} rows from the cache",
             f"[qcls bulk] {d['seconds']:.1f} s after a {d['startup_s']:.1f} s start-up: {d['rows_per_s']} rows/s, "
             f"{d['distinct_per_s']} distinct/s",
             f"[qcls bulk] errors by kind: {json.dumps(d['errors']) if d['errors'] else 'none'}"]
    if d.get("dropped_keys"):
        lines.append(f"[qcls bulk] {d['dropped_keys']:,} JSONL rows had keys beyond the first object's: not in "
                     "this CSV/Parquet output (write JSONL to keep them)")
    if d.get("per_actor"):  # a Ray run
        pool = (f"pool full at {d['pool_full_s']:.1f} s" if d.get("pool_full_s") is not None else
                f"{d['actors_ready']} of {d['actors']} ready before the input ran out")
        lines.append(f"[qcls bulk] {d['actors']} actors, {pool}, " + (
            "rows sorted by query hash (each distinct query on one actor)" if d["shuffle"] else "rows streamed")
            + f"; {d['actor_restarts']} restarts")
        for a in d["per_actor"]:
            lines.append(f"[qcls bulk]   actor {a['pid']} (GPU {','.join(a['gpus']) or 'none'}, ready at "
                         f"{a['ready_s']} s): {a['calls']} calls, {a['rows']:,} rows, {a['classified']:,} classified,"
                         f" busy {a['busy_share']:.0%} of the run")
    for p, c in d["labels"].items():
        total = sum(c.values()) or 1
        lines.append(f"[qcls bulk]   {p}: " + ", ".join(f"{lab} {n / total:.1%}" for lab, n in list(c.items())[:12]))
    return "\n".join(lines) + "\n"


def _hms(s: float) -> str:
    s = int(s)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
