"""The file command's throughput against the engine's own: a 200k-row synthetic e-commerce log
(bench/querylog.py: Zipf-like repeats, English and Chinese) through random-weight Qwen3-4B × prompts=ecommerce8
with the real Qwen tokenizer, at engine.max_batch_size 4, 8 and 16.

Per batch size, one Classifier, then the engine alone (the log's first --engine-queries distinct queries, two
batches in flight) against `qcls bulk` single-process on the whole log with that Classifier (goal ≥ 0.9 ×
engine), and a T4 projection. Ray Data over one or several actors: bench/bulk_ray.py.
"""
from __future__ import annotations

import json
import signal
import sys
import time
from collections import deque

from bench import common as C
from bench.querylog import log_in
from qcls.bulk import runner
from qcls.bulk.options import BulkOptions
from qcls.scoring.tokenization import QueryError, encode_query


def engine_rate(clf, queries: list[str], n: int) -> tuple[float, float]:
    """(distinct queries/s, mean tokens per forward) of the engine alone, two batches in flight."""
    ids = []
    for q in dict.fromkeys(queries):
        try:
            ids.append(encode_query(clf.tokenizer, q, clf.cfg.max_query_tokens))
        except QueryError:
            continue
        if len(ids) == n:
            break
    b, eng = clf.cfg.engine.max_batch_size, clf.engine
    batches = [ids[i:i + b] for i in range(0, len(ids), b)]
    for bt in batches[:4]:  # warm
        eng.collect(eng.launch(bt))
    C.sync()
    pending, tokens = deque(), 0
    t0 = time.perf_counter()
    for bt in batches:
        pending.append(eng.launch(bt))
        if len(pending) == 2:
            tokens += eng.collect(pending.popleft())[3]
    while pending:
        tokens += eng.collect(pending.popleft())[3]
    dt = time.perf_counter() - t0
    return len(ids) / dt, tokens / len(batches)


def main() -> None:
    ap = C.parser(__doc__)
    ap.add_argument("--model", default="qwen3_4b", choices=["qwen3_4b", "qwen3_8b", "tiny"])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--engine-queries", type=int, default=4096, help="distinct queries timed on the engine alone")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    work, queries, log = log_in(args.workdir, args.rows, "qcls_bulk_bench_")
    t0 = time.perf_counter()
    overrides = random_overrides(args.model)
    ckpt_s = time.perf_counter() - t0
    from qcls.progress import set_quiet
    set_quiet(True)
    loaded, rows = None, {}
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `timeout`'s end, as Ctrl-C: report what was measured
    try:
        for b in args.batch_sizes:
            loaded = measure(b, log, work, overrides, queries, loaded, rows, args)
    except KeyboardInterrupt:
        args.stopped = f"stopped by SIGTERM (time limit) or Ctrl-C after batch sizes {sorted(rows)}"
    if not rows:
        sys.exit("no batch size measured")
    best = max(rows, key=lambda b: rows[b]["file"]["distinct_per_s"])
    report(args, rows, best, len(queries), len(set(queries)), ckpt_s)


def random_overrides(model: str) -> list[str]:
    """The benches' Classifier: a random-weight checkpoint of a real shape (written once) × ecommerce8."""
    return C.checkpoint_overrides(model) + ["prompts=ecommerce8", "scoring=trie"]


def measure(b, log, work, overrides, queries, loaded, rows, args):
    """One batch size: a Classifier (reusing the loaded weights), the engine's rate, the file command's."""
    from qcls.classifier import Classifier
    from qcls.config.compose import compose
    opts = BulkOptions(str(log), str(work / f"out_b{b}.parquet"), overrides, batch_size=b, quiet=True)
    cfg = compose(opts.all_overrides())
    t1 = time.perf_counter()
    clf = Classifier(cfg, loaded=loaded)
    startup = time.perf_counter() - t1
    loaded = clf.loaded
    lbytes, lparams = C.layer_sizes(loaded.model)
    eng_rate, tokens = engine_rate(clf, queries, args.engine_queries)
    summary = runner.run(opts, lambda _cfg, c=clf: c)
    mem = {k: round(v / 2**30, 2) for k, v in clf.measured_memory.items()}
    rows[b] = {"startup_s": round(startup, 1), "phases": clf.startup_s, "buckets": len(clf.engine.buckets),
               "graphs": clf.engine.graphs, "memory_gib": mem, "engine": eng_rate, "tokens": tokens,
               "file": summary, "t4": b / C.t4_projection(lbytes, lparams, round(tokens)) * 1e3}
    print(json.dumps({b: {k: v for k, v in rows[b].items() if k != "file"}}, default=str), flush=True)
    print(json.dumps({f"file b{b}": {k: v for k, v in summary.items() if not isinstance(v, (dict, list))}},
                     default=str), flush=True)  # what a time limit would otherwise lose before the report
    del clf
    C.free()
    return loaded


def report(args, rows: dict, best: int, n_rows: int, n_distinct: int, ckpt_s: float) -> None:
    text = C.header(f"bulk: a {n_rows:,}-row query log through `qcls bulk` ({args.model} random weights, ecommerce8)",
                    f"bench/bulk.py --model {args.model} --rows {args.rows} --batch-sizes "
                    f"{' '.join(map(str, args.batch_sizes))}; scoring=trie; CSV in, "
                    f"Parquet out; bench/querylog.py (Zipf s=1.05 over 120k templated EN/ZH queries, seed 0)")
    text += (f"Log: {n_rows:,} rows, {n_distinct:,} distinct (rows / distinct {n_rows / n_distinct:.2f}). "
             f"Checkpoint written/reused in {ckpt_s:.0f} s.\n\n"
             "| batch | engine distinct/s | file distinct/s | file / engine (goal ≥ 0.9) | file rows/s | tokens / "
             "forward | start-up s (engine build + warm-up) | buckets | GPU GiB after start-up | T4 projection "
             "distinct/s |\n|---|---|---|---|---|---|---|---|---|---|\n")
    for b, r in rows.items():
        f, ph = r["file"], r["phases"]
        text += (f"| {b} | {r['engine']:.0f} | {f['distinct_per_s']:.0f} | {f['distinct_per_s'] / r['engine']:.3f} | "
                 f"{f['rows_per_s']:.0f} | {r['tokens']:.0f} | {r['startup_s']} ({ph.get('engine', 0)} + "
                 f"{ph.get('warmup', 0)}) | {r['buckets']} | {r['memory_gib'] or '-'} | {r['t4']:.0f} |\n")
    text += f"\nMost distinct/s through the file command: batch {best}.\n"
    if getattr(args, "stopped", None):
        text += f"\nIncomplete: {args.stopped}.\n"
    f = rows[best]["file"]
    text += f"\nFile run at batch {best}: errors {f['errors']}; cache evictions {f['cache_evicted']}.\n"
    C.report(text, args.no_append)


if __name__ == "__main__":
    main()
