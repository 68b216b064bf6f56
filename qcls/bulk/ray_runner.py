"""The bulk run through Ray Data: read → an actor pool of Classifiers → write, on one machine or a cluster.

- Read: `ray.data.read_parquet` for Parquet; for the text formats `ray.data.read_binary_files` and the same
  parsers as the single-process path (qcls/query_files.py) in a `flat_map`, so rows, line numbers and
  error rows are the same (one read task per file: split a large log into several files to read in parallel).
- Classify: `map_batches` over `BulkActor`, `concurrency=N` actors, `num_gpus=1` each where the cluster has
  GPUs. Each actor builds and warms one Classifier in `__init__` and dedupes what it gets through its own
  bounded cache. A bad row is an error row (never an exception), so it cannot fail the job.
- Several actors: the rows are first sorted by a hash of their query (`sort`), so each query's rows lie
  together and every batch mixes frequent and rare queries alike; a distinct query then reaches one actor
  (or, where its rows cross a batch boundary, the actors of the consecutive batches they fill), and the
  output is sorted back into input order by line (Parquet inputs get a row number for that: their file is
  read whole in one task). Streamed instead (one actor, or `shuffle=False`), a log's frequent queries reach
  every actor: on bench/querylog.py's log 4 actors classify 1.52 × its distinct queries (2 actors 1.25 ×).
- The tally actor (qcls/bulk/ray_tally.py) keeps the counts, the actors' ready times and per-actor stats.
- The actors start while the input is read (and sorted): the read does not wait for the pool. Rates count
  from the moment the first actor reported ready (for N actors, the others' start-up stagger counts against
  the rate); the summary gives that start-up and the moment the pool was full.
- A killed actor (its process, its node) is restarted by Ray and its batches retried (Ray Data's defaults:
  `max_restarts=-1`, `max_task_retries=-1`); the output still has every row once, and the summary counts
  the restarts. An actor reports a batch only once its output is built, so a batch is counted once unless
  its process dies in the moment between report and return.
- Actors take `cpus_per_actor` CPUs each; the run refuses to start where they would take every CPU of the
  cluster (read, shuffle and write tasks need some).
- Write: Parquet with `write_parquet`; JSONL/CSV/TSV with a datasink that writes the same lines as the
  single-process path. OUTPUT is a folder of files, written under OUTPUT.tmp and renamed when complete.
- `address` joins an existing cluster (`ray.init(address=...)`); without it a local Ray starts.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import threading
import time
import zlib
from pathlib import Path

from qcls.results.cache import ResultCache
from qcls.bulk.options import BulkOptions
from qcls.bulk.outputs import Columns, Format
from qcls.bulk.progress import Progress, Tally, format_summary, summary
from qcls.bulk.ray_tally import actor_info, tally_actor
from qcls.query_files import Row, with_query, parse_bytes
from qcls.bulk.pipeline import SLICE_ROWS, Feed, process_chunk
from qcls.bulk.runner import plan
from qcls.errors import ConfigError, MissingPackageError, missing_package
from qcls.progress import warn

QUERY, ERROR, KIND, LINE, REC, OUT = "__qcls_query", "__qcls_error", "__qcls_kind", "__qcls_line", "__qcls_rec", "__qcls_out"
HASH = "__qcls_hash"
# rows per actor call with the rows sorted by query hash: ~350 distinct queries of bench/querylog.py's log,
# under a second of an actor's work, so the run's last calls leave the other actors idle that long at most
SORTED_BATCH_ROWS = 2048
POOL_WARN_S = 300  # a model loads in a minute or two: no actor ready after this, the cluster lacks room
STREAMED_BATCH_ROWS = 4096  # rows per call streamed (one actor: 0.92 × one process, bench/RESULTS.md)


def query_hash(q, line: int) -> int:
    """A stable hash of a query (the same in every process, unlike hash()); a row without a text query
    hashes by its line (such rows need no model and sort to the front)."""
    if not isinstance(q, str):
        return line
    return zlib.crc32(q.encode("utf-8", "surrogatepass"))


def parse_file(item: dict, fmt: str, column: str) -> list[dict]:
    """flat_map: one file's bytes → its rows (pass-through values as JSON text: Arrow needs no types)."""
    return [{LINE: r.line, QUERY: r.query, ERROR: r.error, KIND: r.kind, REC: json.dumps(r.values),
             HASH: query_hash(r.query, r.line)} for r in parse_bytes(fmt, item["bytes"], column)]


def parquet_file(batch, column: str):
    """map_batches over a Parquet file's bytes: its table with each row's number (the key of the sort back
    into input order) and its query's hash (the key of the sort that groups a query's rows)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    tables = []
    for data in batch.column("bytes").to_pylist():
        t = pq.read_table(io.BytesIO(data))
        lines = range(1, t.num_rows + 1)
        qs = t.column(column).to_pylist() if column in t.column_names else [None] * t.num_rows
        t = t.append_column(LINE, pa.array(lines, pa.int64()))
        tables.append(t.append_column(HASH, pa.array([query_hash(q, n) for q, n in zip(qs, lines)], pa.int64())))
    return pa.concat_tables(tables)


class BulkActor:
    """One Classifier (built and warmed here), its cache, and the tally actor it reports to."""

    def __init__(self, cfg_json: str, cols: Columns, out_fmt: str, column: str, cache_size: int, input_schema,
                 tally):
        from qcls.classifier import Classifier
        from qcls.config import QclsConfig
        from qcls.progress import set_quiet
        set_quiet(True)
        self.clf = Classifier(QclsConfig.model_validate_json(cfg_json))
        self.cols, self.column, self.tally = cols, column, tally
        self.fmt = Format(out_fmt, cols, input_schema)
        self.cache = ResultCache(cache_size)
        self.feed = Feed(self.clf)
        self.prompts = [n for n, _ in cols.prompts]
        self.info = actor_info()
        self.key = f"{self.info['node']}:{self.info['pid']}"  # pids repeat across nodes
        import ray
        ray.get(tally.ready.remote(time.time(), self.info))  # on record before the first batch can kill us

    def __call__(self, batch):
        t0 = time.time()
        lines = batch.column(LINE).to_pylist() if LINE in batch.column_names else None
        if REC in batch.column_names:
            rows = [Row(line, json.loads(rec), q, err, kind) for line, q, err, kind, rec in
                    zip(*(batch.column(c).to_pylist() for c in (LINE, QUERY, ERROR, KIND, REC)))]
        else:  # Parquet: the columns themselves (and the row numbers, after a shuffle)
            values = (batch.drop_columns([LINE, HASH]) if lines is not None else batch).to_pylist()
            rows = [with_query(i, v, self.column) for i, v in zip(lines or range(1, len(values) + 1), values)]
        tally = Tally()
        slices = [rows[i:i + SLICE_ROWS] for i in range(0, len(rows), SLICE_ROWS)]
        records, pairs = process_chunk(self.feed, slices, self.cols, self.cache, tally, self.prompts)
        self.cache.absorb(pairs)
        import pyarrow as pa
        if self.fmt.fmt == "parquet":
            out = self.fmt.table(records)
        else:
            out = pa.table({OUT: [self.fmt.lines([r]) for r in records]})
        if lines is not None:
            out = out.append_column(LINE, pa.array(lines, pa.int64()))
        self.tally.add.remote(tally.as_dict(), time.time(), self.key, time.time() - t0)
        return out


def _lines_sink(path: str, header: str, ext: str):
    from ray.data.datasource import BlockBasedFileDatasink

    class LinesDatasink(BlockBasedFileDatasink):
        """JSONL / CSV files of the lines the actors formatted (the single-process path's writer)."""

        def __init__(self):
            super().__init__(path, file_format=ext.lstrip("."))

        def write_block_to_file(self, block, file) -> None:
            file.write((header + "".join(block.to_arrow().column(OUT).to_pylist())).encode("utf-8"))

    return LinesDatasink()


def run(opts: BulkOptions, clf_factory=None, observe=None) -> dict:
    """Classify opts.input into the folder opts.output through Ray Data; the summary as a dict. `observe`, if
    given, is called from the progress thread with the tally actor's snapshot (tally, ready times, last report
    time, per-actor stats) about every `opts.log_every_s` seconds (a bench's hook)."""
    try:
        import ray
        import ray.data
    except ImportError as e:
        if missing_package(e) is None:
            raise
        raise MissingPackageError(f"qcls bulk --ray needs Ray Data ({e.name!r} is not installed)",
                                  "install it with: pip install 'qcls[bulk]'") from None
    from qcls.config.compose import compose
    from qcls.heads.startup import choose, portable
    cfg = compose(opts.all_overrides())
    reader, cols, fmt = plan(opts, cfg)
    if opts.actors < 1:
        raise ConfigError(f"--actors {opts.actors}: a Ray run needs at least one actor", "use --actors 1 or more")
    choose(cfg)  # a head file that cannot serve these prompts is refused here, not in every actor after Ray starts
    out = Path(opts.output)
    tmp = out.with_name(out.name + ".tmp")
    wall0 = time.time()
    if not ray.is_initialized():
        kw = {}
        if opts.address is None:  # a local Ray: room for the actors and for two read/write tasks beside them
            need = int(opts.actors * opts.cpus_per_actor) + 2
            if need > (os.cpu_count() or 1):
                warn(f"a local Ray with {need} logical CPUs on {os.cpu_count()} cores: {opts.actors} actors "
                     f"× {opts.cpus_per_actor:g} CPUs + 2 for reading and writing share them")
            kw["num_cpus"] = max(need, os.cpu_count() or 1)
        ray.init(address=opts.address, include_dashboard=False, log_to_driver=not opts.quiet, **kw)
    res = ray.cluster_resources()
    gpus = opts.gpus_per_actor if opts.gpus_per_actor is not None else (1.0 if res.get("GPU", 0) >= 1 else 0.0)
    cpus = res.get("CPU", 0)
    if opts.actors * opts.cpus_per_actor >= cpus:
        raise ConfigError(f"{opts.actors} actors × {opts.cpus_per_actor:g} CPUs would take all {cpus:g} CPUs of the "
                          "Ray cluster, leaving none to read and write", "use fewer --actors or a bigger cluster")
    if gpus and opts.actors * gpus > res.get("GPU", 0):
        raise ConfigError(f"{opts.actors} actors × {gpus:g} GPUs: the Ray cluster has {res.get('GPU', 0):g}",
                          "use --actors at most the cluster's GPU count")
    ctx = ray.data.DataContext.get_current()
    ctx.wait_for_min_actors_s = 0  # the pool starts beside the read (a positive wait blocks the executor)
    ctx.execution_options.preserve_order = True  # output files in input order
    ctx.enable_progress_bars = False
    tally_ref = tally_actor(ray, opts.actors)
    shuffle = opts.actors > 1 if opts.shuffle is None else opts.shuffle
    batch_rows = opts.ray_batch_rows or (SORTED_BATCH_ROWS if shuffle else STREAMED_BATCH_ROWS)
    ds = _rows(ray, opts, reader, shuffle, batch_rows)
    ds = ds.map_batches(BulkActor, fn_constructor_kwargs=dict(
        cfg_json=portable(cfg).model_dump_json(), cols=cols, out_fmt=fmt.fmt, column=reader.column,
        cache_size=opts.cache_size, input_schema=fmt.input_schema, tally=tally_ref),
        batch_size=batch_rows, batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=opts.actors), num_gpus=gpus,
        num_cpus=opts.cpus_per_actor)
    if shuffle:
        ds = ds.sort(LINE)
    if tmp.exists():
        shutil.rmtree(tmp)
    prog = Progress(Tally(), None, opts.quiet, log_every_s=opts.log_every_s)
    done = threading.Event()
    watcher = threading.Thread(target=_watch, args=(ray, tally_ref, prog, done, observe), daemon=True)
    watcher.start()
    try:
        if fmt.fmt == "parquet":
            if reader.fmt != "parquet" or shuffle:  # the row numbers are not an output column
                ds = ds.drop_columns([LINE])
            ds.write_parquet(str(tmp))
        else:
            ds.write_datasink(_lines_sink(str(tmp), fmt.header(), out.suffix))
    finally:
        done.set()
        watcher.join()
    end = time.time()
    tally, ready_at, _ = ray.get(tally_ref.snapshot.remote())
    actors = ray.get(tally_ref.actor_stats.remote())
    at_full = ray.get(tally_ref.counts_at_full.remote())
    tmp.mkdir(exist_ok=True)  # Ray writes no folder for an input without rows
    if out.exists():
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    os.replace(tmp, out)
    prog.close()
    first = min(ready_at) if ready_at else end
    for a in actors:
        for k in ("ready_at", "first_at", "last_at"):  # seconds after the command's start
            t = a.pop(k)
            a[k.replace("_at", "_s")] = round(t - wall0, 1) if t is not None else None
        a["busy_share"] = round(a["busy_s"] / max(1e-9, end - first), 3)
    result = summary(tally, end - first, first - wall0, {
        "output": opts.output, "actors": opts.actors, "gpus_per_actor": gpus,
        "actors_ready": sum(not a["restarted"] for a in actors),
        "actor_restarts": sum(a["restarted"] for a in actors),
        "pool_full_s": None if at_full is None else round(at_full[0] - wall0, 3), "started_at": wall0,
        "shuffle": shuffle, "per_actor": actors,
        # what the full pool did, from the N-th actor ready to the output written (the sort back and the write
        # included); the rates above also count the start-up stagger
        "after_full": None if at_full is None else {
            "seconds": round(end - at_full[0], 3), "rows": tally.rows - at_full[1],
            "classified": tally.classified - at_full[2],
            "distinct_per_s": round((tally.classified - at_full[2]) / max(1e-9, end - at_full[0]), 1)},
        "batch_size": cfg.engine.max_batch_size,
        "files": sorted(p.name for p in out.iterdir())})
    if not opts.quiet:
        import sys
        sys.stderr.write(format_summary(result))
    return result


def _rows(ray, opts: BulkOptions, reader, shuffle: bool, batch_rows: int):
    """The input's rows as a dataset: streamed in input order, or sorted by query hash (shuffle)."""
    path = str(Path(opts.input).resolve())
    if reader.fmt == "parquet" and not shuffle:
        ds = ray.data.read_parquet(path, partitioning=None)  # no Hive keys from the path: the columns only
    elif reader.fmt == "parquet":
        ds = ray.data.read_binary_files(path).map_batches(parquet_file, batch_size=1, batch_format="pyarrow",
                                                          fn_kwargs={"column": reader.column})
    else:
        ds = ray.data.read_binary_files(path).flat_map(parse_file, fn_kwargs={"fmt": reader.fmt,
                                                                            "column": reader.column})
    if shuffle:  # (a sort's output has as many blocks as its input: one per file)
        ds = ds.sort(HASH)
    # a file is one read task and one block: blocks of one batch each (streaming) let every actor take work
    return ds.repartition(target_num_rows_per_block=batch_rows)


def _watch(ray, tally_ref, prog: Progress, done: threading.Event, observe=None) -> None:
    """The driver's progress line, from the tally actor, every few seconds while the job runs; its rates
    count from the moment the first actor is ready. Says so once when no actor is ready after POOL_WARN_S."""
    started, warned, full = time.time(), False, False
    while not done.wait(min(prog.every, 1.0) if not full else prog.every):
        try:
            snap = ray.get(tally_ref.snapshot.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - progress is best effort; the summary reads the tally again
            continue
        prog.tally, ready, _ = snap
        if not full and ready:
            full = True
            prog.restart_clock()
        elif full:
            prog.tick(force=True)
        elif not warned and time.time() - started > POOL_WARN_S:
            warned = True
            free = ray.available_resources()
            warn(f"no Ray actor is ready after {POOL_WARN_S} s; the cluster has {free.get('GPU', 0):g} GPUs and "
                 f"{free.get('CPU', 0):g} CPUs free now: `ray status` shows who holds the rest")
        if observe is not None:
            try:
                observe(*snap, ray.get(tally_ref.actor_stats.remote(), timeout=10))
            except Exception as e:  # noqa: BLE001 - a caller's hook must not stop the progress line
                warn(f"bulk --ray: the observer raised {e!r}")
