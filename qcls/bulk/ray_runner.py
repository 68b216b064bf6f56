"""The bulk run through Ray Data: read → an actor pool of Classifiers → write, on one machine or a cluster.

- Read: `ray.data.read_parquet` for Parquet; for the text formats `ray.data.read_binary_files` and the same
  parsers as the single-process path (qcls/bulk/readers.py) in a `flat_map`, so rows, line numbers and
  error rows are the same (one read task per file: split a large log into several files to read in parallel).
- Classify: `map_batches` over `BulkActor`, `concurrency=N` actors, `num_gpus=1` each where the cluster has
  GPUs. Each actor builds and warms one Classifier in `__init__`, and dedupes within each batch it gets and
  across its batches through its own bounded cache (the run as a whole does not dedupe across actors).
  A bad row is an error row (never an exception), so it cannot fail the job.
- The pool is full before the clock starts: `DataContext.wait_for_min_actors_s` makes Ray Data wait for
  every actor's `__init__` before it hands out the first batch, and the rates count from the moment the
  last actor reported ready (the tally actor keeps those times).
- Actors take `cpus_per_actor` CPUs each; the run refuses to start where they would take every CPU of the
  cluster (read and write tasks need some).
- Write: Parquet with `write_parquet`; JSONL/CSV/TSV with a datasink that writes the same lines as the
  single-process path. OUTPUT is a folder of files, written under OUTPUT.tmp and renamed when complete.
- `address` joins an existing cluster (`ray.init(address=...)`); without it a local Ray starts.
"""
from __future__ import annotations

import json
import os
from collections import Counter
import shutil
import threading
import time
from pathlib import Path

from qcls.bulk.cache import ResultCache
from qcls.bulk.options import BulkOptions
from qcls.bulk.outputs import Columns, Format
from qcls.bulk.progress import Progress, Tally, format_summary, summary
from qcls.bulk.readers import Row, with_query, parse_bytes
from qcls.bulk.pipeline import SLICE_ROWS, Feed, process_chunk
from qcls.bulk.runner import plan
from qcls.errors import ConfigError, MissingPackageError, missing_package
from qcls.progress import warn

QUERY, ERROR, KIND, LINE, REC, OUT = "__qcls_query", "__qcls_error", "__qcls_kind", "__qcls_line", "__qcls_rec", "__qcls_out"


def parse_file(item: dict, fmt: str, column: str) -> list[dict]:
    """flat_map: one file's bytes → its rows (pass-through values as JSON text: Arrow needs no types)."""
    return [{LINE: r.line, QUERY: r.query, ERROR: r.error, KIND: r.kind, REC: json.dumps(r.values)}
            for r in parse_bytes(fmt, item["bytes"], column)]


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
        tally.ready.remote(time.time())

    def __call__(self, batch):
        if REC in batch.column_names:
            rows = [Row(line, json.loads(rec), q, err, kind) for line, q, err, kind, rec in
                    zip(*(batch.column(c).to_pylist() for c in (LINE, QUERY, ERROR, KIND, REC)))]
        else:  # Parquet: the columns themselves
            rows = [with_query(i, values, self.column) for i, values in enumerate(batch.to_pylist(), 1)]
        tally = Tally()
        slices = [rows[i:i + SLICE_ROWS] for i in range(0, len(rows), SLICE_ROWS)]
        records, pairs = process_chunk(self.feed, slices, self.cols, self.cache, tally, self.prompts)
        self.cache.absorb(pairs)
        self.tally.add.remote(tally.as_dict(), time.time())
        if self.fmt.fmt == "parquet":
            return self.fmt.table(records)
        import pyarrow as pa
        return pa.table({OUT: [self.fmt.lines([r]) for r in records]})


def _tally_actor(ray):
    @ray.remote(num_cpus=0)
    class TallyActor:
        def __init__(self):
            self.tally, self.ready_at, self.last = Tally(), [], None

        def ready(self, t: float) -> None:
            self.ready_at.append(t)

        def add(self, d: dict, t: float) -> None:
            self.tally.merge(Tally(d["rows"], d["classified"], d["cached"], Counter(d["errors"]),
                                   {p: Counter(c) for p, c in d["labels"].items()}))
            self.last = t

        def snapshot(self):
            return self.tally, list(self.ready_at), self.last

    return TallyActor.remote()


def _lines_sink(path: str, header: str, ext: str):
    from ray.data.datasource import BlockBasedFileDatasink

    class LinesDatasink(BlockBasedFileDatasink):
        """JSONL / CSV files of the lines the actors formatted (the single-process path's writer)."""

        def __init__(self):
            super().__init__(path, file_format=ext.lstrip("."))

        def write_block_to_file(self, block, file) -> None:
            file.write((header + "".join(block.to_arrow().column(OUT).to_pylist())).encode("utf-8"))

    return LinesDatasink()


def run(opts: BulkOptions, clf_factory=None) -> dict:
    """Classify opts.input into the folder opts.output through Ray Data; the summary as a dict."""
    try:
        import ray
        import ray.data
    except ImportError as e:
        if missing_package(e) is None:
            raise
        raise MissingPackageError(f"qcls bulk --ray needs Ray Data ({e.name!r} is not installed)",
                                  "install it with: pip install 'qcls[bulk]'") from None
    from qcls.compose import compose
    from qcls.heads.startup import portable
    cfg = compose(opts.all_overrides())
    reader, cols, fmt = plan(opts, cfg)
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
    ctx.wait_for_min_actors_s = opts.pool_timeout_s
    ctx.execution_options.preserve_order = True  # output files in input order
    ctx.enable_progress_bars = False
    tally_ref = _tally_actor(ray)
    path = str(Path(opts.input).resolve())
    if reader.fmt == "parquet":
        ds = ray.data.read_parquet(path)
    else:
        ds = ray.data.read_binary_files(path).flat_map(parse_file, fn_kwargs={"fmt": reader.fmt,
                                                                            "column": reader.column})
    # a file is one read task and one block: blocks of one batch each (streaming) let every actor take work
    ds = ds.repartition(target_num_rows_per_block=opts.ray_batch_rows)
    schema = fmt.input_schema
    ds = ds.map_batches(BulkActor, fn_constructor_kwargs=dict(
        cfg_json=portable(cfg).model_dump_json(), cols=cols, out_fmt=fmt.fmt, column=reader.column,
        cache_size=opts.cache_size, input_schema=schema, tally=tally_ref),
        batch_size=opts.ray_batch_rows, batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=opts.actors), num_gpus=gpus,
        num_cpus=opts.cpus_per_actor)
    if tmp.exists():
        shutil.rmtree(tmp)
    prog = Progress(Tally(), None, opts.quiet, log_every_s=opts.log_every_s)
    done = threading.Event()
    watcher = threading.Thread(target=_watch, args=(ray, tally_ref, prog, done, opts.actors), daemon=True)
    watcher.start()
    try:
        if fmt.fmt == "parquet":
            ds.write_parquet(str(tmp))
        else:
            ds.write_datasink(_lines_sink(str(tmp), fmt.header(), out.suffix))
    finally:
        done.set()
        watcher.join()
    end = time.time()
    tally, ready_at, _ = ray.get(tally_ref.snapshot.remote())
    if out.exists():
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    os.replace(tmp, out)
    prog.close()
    pool_full = max(ready_at) if ready_at else end
    startup = pool_full - wall0
    result = summary(tally, end - pool_full, startup, {"output": opts.output, "actors": opts.actors,
                                                       "gpus_per_actor": gpus, "actors_ready": len(ready_at),
                                                       "batch_size": cfg.engine.max_batch_size,
                                                       "files": sorted(p.name for p in out.iterdir())})
    if not opts.quiet:
        import sys
        sys.stderr.write(format_summary(result))
    return result


def _watch(ray, tally_ref, prog: Progress, done: threading.Event, actors: int) -> None:
    """The driver's progress line, from the tally actor, every few seconds while the job runs; its rates
    count from the moment the pool is full."""
    full = False
    while not done.wait(min(prog.every, 1.0) if not full else prog.every):
        try:
            prog.tally, ready, _ = ray.get(tally_ref.snapshot.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - progress is best effort; the summary reads the tally again
            continue
        if not full and len(ready) >= actors:
            full = True
            prog.restart_clock()
        elif full:
            prog.tick(force=True)
