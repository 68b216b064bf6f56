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

import hashlib
import json
import queue
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from pathlib import Path
from typing import Iterator

from qcls.bulk.cache import ResultCache
from qcls.bulk.options import BulkOptions
from qcls.bulk.outputs import Columns, Format, Result, output_format
from qcls.bulk.pipeline import classify_distinct, error_kind
from qcls.bulk.progress import Progress, Tally, format_summary, summary
from qcls.bulk.readers import Reader, Row, file_identity
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
    return {"version": 1, **file_identity(opts.input), "column": opts.column, "all_labels": opts.all_labels,
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


def chunks(rows: Iterator[Row], size: int) -> Iterator[list[Row]]:
    while chunk := list(islice(rows, size)):
        yield chunk


def prefetch(it: Iterator, depth: int = 1) -> Iterator:
    """Read the next chunk on a thread while this one is classified."""
    q: queue.Queue = queue.Queue(depth)
    end = object()

    def work():
        try:
            for x in it:
                q.put(x)
        except BaseException as e:  # noqa: BLE001 - re-raised in the consumer
            q.put(e)
        q.put(end)

    threading.Thread(target=work, daemon=True, name="qcls-bulk-read").start()
    while (x := q.get()) is not end:
        if isinstance(x, BaseException):
            raise x
        yield x


def process_chunk(clf, rows: list[Row], cols: Columns, cache: ResultCache, tally: Tally,
                  prompts: list[str]) -> tuple[list[dict], list[tuple[str, Result]]]:
    """Records of one chunk and its (query, result) pairs for the cache, in input order; every distinct
    query not in the cache is classified once."""
    new: dict[str, None] = {}
    for r in rows:
        if r.query is not None and cache.get(r.query) is None:
            new.setdefault(r.query)
    fresh = dict(zip(new, classify_distinct(clf, list(new)))) if new else {}
    tally.classified += sum(1 for q in fresh.values() if q.ok)
    records, pairs = [], []
    for r in rows:
        result, error = None, r.error
        if r.query is not None:
            qr = fresh.get(r.query)
            if qr is None or qr.ok:
                result = cache.get(r.query) if qr is None else cols.result_of(qr)
                pairs.append((r.query, result))
            else:
                error = qr.error
        records.append(cols.record(r.values, result, error))
        count(tally, result, error, prompts)
    tally.cached += len(pairs) - sum(1 for q in fresh.values() if q.ok)
    return records, pairs


def count(tally: Tally, result: Result | None, error: str | None, prompts: list[str]) -> None:
    tally.rows += 1
    if error:
        tally.errors[error_kind(error)] += 1
    elif result is not None:
        tally.count_result(prompts, result[0])


def run(opts: BulkOptions, clf_factory=None) -> dict:
    """Classify opts.input into opts.output; the summary as a dict. `clf_factory(cfg)` builds the Classifier
    (tests and the benchmark pass one that reuses a loaded model)."""
    from qcls.compose import compose
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
    parts: list[Path] = []
    with ThreadPoolExecutor(1, thread_name_prefix="qcls-bulk-write") as writer:
        pending = None
        for i, rows in enumerate(prefetch(chunks(reader.rows(), opts.chunk_rows))):
            path = folder / part_name(i, ext)
            parts.append(path)
            if i < n_done:  # written by an interrupted run: rebuild the cache and the counts from it
                recs = fmt.read_part(path)
                if len(recs) != len(rows):
                    raise ConfigError(f"{path} holds {len(recs)} rows where the input's chunk {i} has {len(rows)}",
                                      f"the input changed since the interrupted run: delete {folder} to start over")
                _replay(recs, cols, cache, tally, prompts, reader.column)
                continue
            records, pairs = process_chunk(clf, rows, cols, cache, tally, prompts)
            _dropped_keys(records, cols, fmt.fmt, tally)
            cache.absorb(pairs)
            if pending is not None:
                pending.result()
            pending = writer.submit(fmt.write_part, path, records)
            prog.tick()
        if pending is not None:
            pending.result()
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
