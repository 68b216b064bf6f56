"""The single-process bulk run: chunks of rows → dedupe → the engine (two batches in flight) → part files →
the output file.

Resume: each chunk of `chunk_rows` input rows is written as one part file in `OUTPUT.parts/` (under a
temporary name, renamed when complete), beside a manifest of the arguments. A rerun with the same arguments
skips the chunks whose parts exist (a `.tmp` left by a kill is deleted and its chunk redone), rebuilds the
result cache from those parts, and goes on; when every chunk is done the parts are joined into OUTPUT (again
under a temporary name) and the folder is removed. So a SIGKILL anywhere, then the same command, gives the
output an uninterrupted run gives, byte for byte.

Memory: one chunk of rows, one chunk's new distinct queries, and the cache (cache_size distinct queries).
"""
from __future__ import annotations

import gc
import hashlib
import json
import queue
import shutil
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

from qcls.results.cache import ResultCache
from qcls.bulk.options import BulkOptions
from qcls.bulk.outputs import Columns, Format, output_format
from qcls.bulk.pipeline import SLICE_ROWS, Feed, count, process_chunk
from qcls.bulk.progress import Progress, Tally, format_summary, summary
from qcls.query_files import Reader, Row, file_identity
from qcls.errors import ConfigError

MANIFEST = "run.json"


def parts_dir(output: str | Path) -> Path:
    out = Path(output)
    return out.with_name(out.name + ".parts")


def plan(opts: BulkOptions, cfg) -> tuple[Reader, Columns, Format]:
    """Everything checked before the model loads: the input, the output's name, the columns."""
    reader = Reader(opts.input, opts.column)
    fmt = output_format(opts.output)
    cols = Columns.build(reader.columns, [(p.name, p.labels) for p in cfg.prompts], opts.all_labels)
    return reader, cols, Format(fmt, cols, getattr(reader, "schema", None) if reader.fmt == "parquet" else None)


def manifest(opts: BulkOptions, cfg, fmt: str) -> dict:
    return {"version": 2, **file_identity(opts.input), "column": opts.column, "all_labels": opts.all_labels,
            "chunk_rows": opts.chunk_rows, "cache_size": opts.cache_size, "output_format": fmt,
            "config": hashlib.sha256(cfg.model_dump_json().encode()).hexdigest()[:16]}


def done_parts(folder: Path, want: dict, ext: str) -> int:
    """Chunks already written by an interrupted run with these arguments (a new folder: 0)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / MANIFEST
    if path.exists():
        have = json.loads(path.read_text())
        diff = sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))
        if diff:
            raise ConfigError(f"{folder} holds an interrupted run with other arguments or input (differs in {diff})",
                              "run the same command again to resume it, or delete that folder to start over")
    else:
        tmp = path.with_name(MANIFEST + ".tmp")
        tmp.write_text(json.dumps(want, indent=1))
        tmp.replace(path)
    for t in folder.glob("*.tmp"):  # a part being written when the run was killed: its chunk is redone
        t.unlink()
    n = 0
    while (folder / part_name(n, ext)).exists():
        n += 1
    stray = [p.name for p in folder.glob("part-*") if p.name != part_name(int(p.name[5:11]), ext)
             or int(p.name[5:11]) >= n]
    if stray:
        raise ConfigError(f"{folder} has part files out of sequence: {stray[:5]}",
                          "delete that folder to start over")
    return n


def part_name(i: int, ext: str) -> str:
    return f"part-{i:06d}{ext}"


class Slices:
    """The input's rows in slices of at most `slice_rows`, chunk by chunk (`chunk_rows` rows a chunk), read on a
    thread ahead of the classifier: `get(block)` gives the current chunk's next slice, [] when none is read
    yet (block=False), None at the chunk's end; `next_chunk()` moves on and says whether a chunk is left."""

    _END, _EOF = object(), object()

    def __init__(self, rows: Iterator[Row], chunk_rows: int, slice_rows: int = SLICE_ROWS, depth: int = 64):
        self._q: queue.Queue = queue.Queue(depth)
        self._head = None
        threading.Thread(target=self._work, args=(rows, chunk_rows, slice_rows), daemon=True,
                         name="qcls-bulk-read").start()

    def _work(self, rows, chunk_rows: int, slice_rows: int) -> None:
        put = self._q.put
        try:
            n, buf = 0, []
            for row in rows:
                buf.append(row)
                n += 1
                if len(buf) == slice_rows or n == chunk_rows:
                    put(buf)
                    buf = []
                if n == chunk_rows:
                    put(self._END)
                    n = 0
            if buf:
                put(buf)
            if n:
                put(self._END)
        except BaseException as e:  # noqa: BLE001 - re-raised in the consumer
            put(e)
        put(self._EOF)

    def _take(self, block: bool):
        if self._head is not None:
            x, self._head = self._head, None
            return x
        try:
            x = self._q.get(block)
        except queue.Empty:
            return []
        if isinstance(x, BaseException):
            raise x
        return x

    def next_chunk(self) -> bool:
        """Whether another chunk follows (waits for the reader)."""
        self._head = x = self._take(True)
        return x is not self._EOF

    def get(self, block: bool) -> list[Row] | None:
        x = self._take(block)
        if x is self._END:
            return None
        if x is self._EOF:  # kept for next_chunk
            self._head = x
            return None
        return x

    def chunk(self) -> list[Row]:
        """The rest of the current chunk's rows at once (a chunk a resumed run skips)."""
        rows: list[Row] = []
        while (s := self.get(True)) is not None:
            rows += s
        return rows


def run(opts: BulkOptions, clf_factory=None) -> dict:
    """Classify opts.input into opts.output; the summary as a dict. `clf_factory(cfg)` builds the Classifier
    (tests and the benchmark pass one that reuses a loaded model)."""
    from qcls.config.compose import compose
    cfg = compose(opts.all_overrides())
    reader, cols, fmt = plan(opts, cfg)
    ext = Path(opts.output).suffix.lower()
    folder = parts_dir(opts.output)
    n_done = done_parts(folder, manifest(opts, cfg, fmt.fmt), ext)
    t0 = time.perf_counter()
    if clf_factory is None:
        from qcls.classifier import Classifier
        clf = Classifier(cfg)
    else:
        clf = clf_factory(cfg)
    startup = time.perf_counter() - t0
    prompts = [p.name for p in cfg.prompts]
    tally, cache = Tally(), ResultCache(opts.cache_size)
    prog = Progress(tally, reader.progress, opts.quiet, log_every_s=opts.log_every_s)
    prog.restart_clock()
    try:
        parts = _write_parts(clf, reader, opts.chunk_rows, n_done, folder, ext, cols, fmt, cache, tally, prompts,
                             prog)
    finally:
        gc.unfreeze()  # process_chunk froze what the run kept alive; a run that raised leaves nothing frozen either
    fmt.join(parts, Path(opts.output))
    shutil.rmtree(folder)
    seconds = time.perf_counter() - prog.t0
    prog.close()
    out = summary(tally, seconds, startup, {"output": opts.output, "batch_size": cfg.engine.max_batch_size,
                                           "cache_evicted": cache.evicted})
    if not opts.quiet:
        import sys
        sys.stderr.write(format_summary(out))
    return out


def _write_parts(clf, reader: Reader, chunk_rows: int, n_done: int, folder: Path, ext: str, cols: Columns,
                 fmt: Format, cache: ResultCache, tally: Tally, prompts: list[str], prog: Progress) -> list[Path]:
    """Every chunk classified (or, for the first n_done, replayed from the part an interrupted run wrote) and
    written as a part file; the parts in order."""
    parts: list[Path] = []
    feed = Feed(clf)
    slices = Slices(reader.rows(), chunk_rows)
    with ThreadPoolExecutor(1, thread_name_prefix="qcls-bulk-write") as writer:
        writes: deque = deque()
        i = 0
        while slices.next_chunk():
            path = folder / part_name(i, ext)
            parts.append(path)
            if i < n_done:  # written by an interrupted run: rebuild the cache and the counts from it
                rows = slices.chunk()
                recs = fmt.read_part(path)
                if len(recs) != len(rows):
                    raise ConfigError(f"{path} holds {len(recs)} rows where the input's chunk {i} has {len(rows)}",
                                      f"the input changed since the interrupted run: delete {folder} to start over")
                _replay(recs, cols, cache, tally, prompts, reader.column)
            else:
                records, pairs = process_chunk(feed, (), cols, cache, tally, prompts, next_slice=slices.get,
                                               tick=prog.tick)
                _dropped_keys(records, cols, fmt.fmt, tally)
                cache.absorb(pairs)
                while len(writes) > 1:  # at most two chunks' records wait for the writer: waiting on the last
                    writes.popleft().result()  # one would stall the device while it writes
                writes.append(writer.submit(fmt.write_part, path, records))
            i += 1
        for w in writes:
            w.result()
    return parts


def _replay(recs: list[dict], cols: Columns, cache: ResultCache, tally: Tally, prompts: list[str],
            column: str) -> None:
    pairs = []
    for rec in recs:
        result = cols.parse(rec)
        error = rec.get("error") or None
        if result is not None:
            pairs.append((rec[column], result))
        count(tally, result, error, prompts)
        tally.resumed_rows += 1
    cache.absorb(pairs)


def _dropped_keys(records: list[dict], cols: Columns, fmt: str, tally: Tally) -> None:
    if fmt != "jsonl":
        known = set(cols.names)
        tally.dropped_keys += sum(1 for r in records if not known.issuperset(r))
