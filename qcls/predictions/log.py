"""The prediction log: what a serving replica answered, one row per answered query, in part files of its own.

A row (schema.py's names): `time` (UTC, ISO 8601, when the answer was handed back), `query`, `fingerprint` (the
configuration that answered), per prompt `pred:<p>`, `pred:<p>:prob`, `pred:<p>:abstained` (with all_labels
also `prob:<p>:<label>`), `cache_hit` and `latency_ms` (the request's arrival at the replica to its answer).
Refused and failed queries are not answered, so not written. `sample_rate` < 1 keeps each answered query with
that probability (random per row, so frequent queries keep their share of the rows).

The request path only appends (time, result) to a bounded queue (`add`, on the replica's event loop): a full
queue drops the row and counts it, so the log never holds a request up. A daemon thread drains the queue every
TICK_S, builds the rows (yielding the interpreter every few rows: the request path keeps its turn), and every
`flush_s` (or once `queue_rows` rows wait) writes them as one part per configuration: `part-<replica>-<n>.jsonl`
(or `.parquet`, whose Arrow conversion runs here too, a column at a time), written under a hidden temporary name
in the same folder, synced and renamed, so a reader never sees half a file and a killed replica loses at most
the rows of its last `flush_s`. A reload changes the fingerprint of the rows, and so the part they go to.
"""
from __future__ import annotations

import logging
import os
import random
import re
import socket
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable, Iterable

from qcls.config import PredictionLogSpec
from qcls.errors import ConfigError, MissingPackageError
from qcls.predictions import schema
from qcls.results import QueryResult

log = logging.getLogger("qcls.serve")
TIME, _, FINGERPRINT, CACHE_HIT, LATENCY = schema.LOG_FIELDS
TICK_S = 0.05  # how often the writer drains the queue: small bursts of row building (a part is written every flush_s)
YIELD_ROWS = 4  # rows built between two hand-overs of the interpreter to the request path (~0.1-0.4 ms)
PART = re.compile(r"^part-[A-Za-z0-9_.-]+-\d{6,}\.(jsonl|parquet)$")
OFF = "or turn the log off: serve.prediction_log.folder=null"


def replica_name() -> str:
    """This process's name in its part files: host and process id (a restarted replica continues the numbers)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{socket.gethostname()}-{os.getpid()}")


def check_folder(spec: PredictionLogSpec) -> Path:
    """The log's folder, created if missing, checked before a replica loads its model: writable, holding nothing
    but part files (hidden files, such as a part being written, are ignored), and pyarrow where Parquet is asked
    for. Each problem is refused with the folder or file named and the way out."""
    if spec.format == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise MissingPackageError("serve.prediction_log.format=parquet needs pyarrow, which is not installed",
                                      "pip install pyarrow (or qcls's [bulk] extra), or write JSONL: "
                                      "serve.prediction_log.format=jsonl") from None
    folder = Path(spec.folder)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"serve.prediction_log.folder={folder} is a file, not a folder",
                          f"give a folder (it is created if missing), {OFF}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".probe-{replica_name()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"serve.prediction_log.folder={folder}: cannot write there ({e.strerror or e})",
                          f"give a folder this replica's user can write, {OFF}") from None
    foreign = sorted(p.name for p in folder.iterdir() if not p.name.startswith(".") and not PART.match(p.name))
    if foreign:
        raise ConfigError(f"serve.prediction_log.folder={folder} holds files that are not prediction log parts: "
                          f"{', '.join(foreign[:5])}" + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""),
                          "give an empty folder, or one that only the prediction log writes "
                          f"(part-<replica>-<n>.jsonl or .parquet), {OFF}")
    return folder


class PredictionLog:
    """`add` on the request path, `close` once the replica stops. `observer(written, dropped)` is called on the
    writer thread with the rows written and dropped since its last call (the replica's Prometheus counters)."""

    def __init__(self, spec: PredictionLogSpec, replica: str | None = None,
                 observer: Callable[[int, int], None] | None = None):
        self.spec, self.folder = spec, check_folder(spec)
        self.replica, self.observer = replica or replica_name(), observer
        self.ext = "." + spec.format
        taken = [int(p.stem.rsplit("-", 1)[1]) for p in self.folder.glob(f"part-{self.replica}-*{self.ext}")
                 if PART.match(p.name)]
        self.seq = max(taken, default=-1) + 1  # a reused name continues its numbers: nothing is overwritten
        # rows written, dropped on a full queue (counted on the request path) and lost to a failed write (here)
        self.written = self.dropped = self.lost = 0
        self._reported = (0, 0)
        self._queue: deque[tuple[float, QueryResult]] = deque()
        self._rate, self._cap = spec.sample_rate, spec.queue_rows
        self._soon = max(1, spec.queue_rows // 2)  # a fuller queue wakes the writer before its tick
        self._wake, self._closed = threading.Event(), False
        self._names: dict[str, tuple] = {}  # fingerprint → its columns' names and Arrow kinds, in order
        self._second, self._second_text = -1, ""  # the time column's whole second, formatted once
        # fingerprint → rows of its next part: JSON lines, encoded as they are drained; Parquet's as value lists
        self._parts: dict[str, list] = {}
        if spec.format == "jsonl":
            import orjson
            self._encode = orjson.dumps
        else:
            self._encode = None
        self._opened = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="qcls-prediction-log", daemon=True)
        self._thread.start()

    # -- the request path ----------------------------------------------------------------------------------

    def add(self, results: Iterable[QueryResult]) -> None:
        """Queue the answered results of one request (refused and failed ones are skipped). Never blocks."""
        now, rate, q = time.time(), self._rate, self._queue
        for r in results:
            if r.error is not None or (rate < 1.0 and random.random() >= rate):
                continue
            if len(q) >= self._cap:
                self.dropped += 1
            else:
                q.append((now, r))
        if len(q) >= self._soon:
            self._wake.set()

    # -- the writer thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._wake.wait(TICK_S)
            self._wake.clear()
            closing = self._closed
            try:
                self._drain()
                waiting = sum(map(len, self._parts.values()))
                if closing or (waiting and time.monotonic() - self._opened >= self.spec.flush_s) \
                        or waiting >= self._cap:
                    self._write_parts()
            except Exception:  # noqa: BLE001 - never the replica's problem: its rows are counted as dropped
                log.exception("prediction log: building rows failed")
                self.lost += sum(map(len, self._parts.values()))
                self._parts.clear()
            self._report()
            if closing:
                return

    def _drain(self) -> None:
        q = self._queue
        for i in range(len(q)):
            t, r = q.popleft()
            fp = r.meta.get("fingerprint", "")
            names = (self._names.get(fp) or self._names.setdefault(fp, self._columns(r)))[0]
            row = self._values(t, r, fp)
            self._parts.setdefault(fp, []).append(row if self._encode is None else self._encode(dict(zip(names, row))))
            if i % YIELD_ROWS == YIELD_ROWS - 1:
                time.sleep(0)  # the request path's threads take the interpreter between rows

    def _columns(self, r: QueryResult) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """A configuration's column names and their Arrow kinds, in order (its results all have the same prompts and
        labels)."""
        cols = [(TIME, "string"), (schema.QUERY, "string"), (FINGERPRINT, "string")]
        for p in r.prompts:
            cols += [(schema.label_column(p.prompt), "string"), (schema.prob_column(p.prompt), "float64"),
                     (schema.abstained_column(p.prompt), "bool_")]
            if self.spec.all_labels:
                cols += [(schema.label_prob_column(p.prompt, s.label), "float64") for s in p.labels]
        return tuple(zip(*cols, (CACHE_HIT, "bool_"), (LATENCY, "float64")))

    def _values(self, t: float, r: QueryResult, fp: str) -> list:
        """One row's values, in the order of its configuration's columns."""
        second = int(t)
        if second != self._second:
            self._second, self._second_text = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        row, every = [f"{self._second_text}.{int((t - second) * 1000):03d}+00:00", r.query, fp], self.spec.all_labels
        for p in r.prompts:
            row += (p.label, p.prob, p.abstained)
            if every:
                row += [s.prob for s in p.labels]
        row += (r.meta.get("cache") == "hit", r.timings_ms.get("in_replica"))
        return row

    def _write_parts(self) -> None:
        parts, self._parts, self._opened = self._parts, {}, time.monotonic()
        for fp, rows in parts.items():
            path = self.folder / f"part-{self.replica}-{self.seq:06d}{self.ext}"
            tmp = self.folder / f".{path.name}.tmp"  # hidden: a reader of part-* never sees it
            try:
                with tmp.open("wb") as f:
                    if self._encode is None:
                        import pyarrow.parquet as pq
                        pq.write_table(self._table(rows, *self._names[fp]), f)
                    else:
                        f.write(b"\n".join(rows) + b"\n")
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except OSError as e:  # a full disk, a folder removed: the rows are dropped and counted, serving goes on
                log.error("prediction log: %d rows dropped, %s could not be written (%s)", len(rows), path, e)
                self.lost += len(rows)
                tmp.unlink(missing_ok=True)
                continue
            self.seq += 1
            self.written += len(rows)

    @staticmethod
    def _table(rows: list[list], names: tuple[str, ...], kinds: tuple[str, ...]):
        """One Arrow column at a time (each conversion holds the interpreter only that long)."""
        import pyarrow as pa
        arrays = []
        for kind, values in zip(kinds, zip(*rows)):
            arrays.append(pa.array(values, type=getattr(pa, kind)()))
            time.sleep(0)
        return pa.Table.from_arrays(arrays, names=list(names))

    def _report(self) -> None:
        now = (self.written, self.dropped + self.lost)
        if self.observer is not None and now != self._reported:
            try:
                self.observer(now[0] - self._reported[0], now[1] - self._reported[1])
            except Exception:  # noqa: BLE001 - the metrics must not stop the log
                log.exception("prediction log: reporting its counts failed")
        self._reported = now

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued and stop the writer (the replica is stopping)."""
        self._closed = True
        self._wake.set()
        self._thread.join(timeout_s)
