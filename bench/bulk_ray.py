"""`qcls bulk --ray` over N GPU actors: scaling, and an actor killed mid-run.

bench/bulk.py's log through Ray Data (random-weight Qwen3-4B × ecommerce8, batch 8) for each N in --actors,
one GPU each: the log's distinct queries/s from the first actor ready and with the pool full (scaling against
N × one actor), start-up, GPU utilisation and busy share per actor. One actor streams the rows; several get
them sorted by query hash. --kill N runs N actors again and SIGKILLs one --kill-after-s after the pool is full:
every input row must come out exactly once with the clean run's labels.
"""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pyarrow.parquet as pq

from bench import common as C
from bench.querylog import log_in
from qcls.bulk import ray_runner
from qcls.bulk.options import BulkOptions
from qcls.predictions.schema import label_column, prob_column


def one_run(log: Path, work: Path, overrides: list[str], n: int, kill_after: float | None, batch: int) -> dict:
    """One `qcls bulk --ray` run of n actors; with kill_after, one actor is SIGKILLed that long after the pool
    is full. The summary, with the GPU utilisation per actor and the kill's times."""
    out = work / f"out_n{n}{'_kill' if kill_after else ''}.parquet"
    opts = BulkOptions(str(log), str(out), overrides, batch_size=batch, quiet=True, ray=True, actors=n,
                       log_every_s=0.5)
    kill: dict = {}

    def observe(tally, ready_at, last, actors):
        if kill_after is None or kill or len(ready_at) < n:
            return
        pool_full = sorted(ready_at)[n - 1]
        if time.time() - pool_full >= kill_after:
            # the actor that reported last is working (an idle one may be on its way out of the pool)
            victim = max((a for a in actors if a["last_at"]), key=lambda a: a["last_at"], default=actors[0])["pid"]
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                return  # gone already: the next report picks another
            kill.update(pid=victim, at=time.time(), after_full_s=round(time.time() - pool_full, 1),
                        rows_then=tally.rows)

    with C.GpuSampler() as gpu:
        s = ray_runner.run(opts, observe=observe)
    first = s["started_at"] + s["startup_s"]  # the first actor ready: the timed seconds start here
    for a in s["per_actor"]:
        utils = [gpu.mean(g, first, first + s["seconds"]) for g in a["gpus"]]
        a["gpu_util"] = round(sum(utils) / len(utils), 1) if utils and None not in utils else None
    if kill_after is not None:
        if not kill:
            raise SystemExit(f"the run of {n} actors ended before an actor could be killed: lower --kill-after-s")
        back = [a for a in s["per_actor"] if a["restarted"]]
        kill["restart_s"] = round(s["started_at"] + back[0]["ready_s"] - kill["at"], 1) if back else None
        s["kill"] = kill
    s["check"] = check_output(out, log)
    s["out"] = str(out)
    return s


def check_output(out: Path, log: Path) -> dict:
    """Every input row exactly once, in input order (the CSV's id column is the row's index)."""
    ids = [int(i) for f in sorted(out.iterdir()) for i in pq.read_table(f, columns=["id"]).column("id").to_pylist()]
    n_in = sum(1 for _ in log.open(encoding="utf-8")) - 1
    return {"rows_out": len(ids), "rows_in": n_in, "each_once": sorted(ids) == list(range(n_in)),
            "in_order": ids == list(range(n_in))}


def same_labels(a: str, b: str, prompts: list[str]) -> dict:
    """How far two runs' outputs agree: rows with every winner equal, the largest |Δ probability|."""
    x, y = ([r for f in sorted(Path(o).iterdir()) for r in pq.read_table(f).to_pylist()] for o in (a, b))
    key = lambda r: int(r["id"])  # noqa: E731
    x, y = sorted(x, key=key), sorted(y, key=key)
    lab, pr = [label_column(p) for p in prompts], [prob_column(p) for p in prompts]
    equal = sum(all(r[c] == s[c] for c in lab) for r, s in zip(x, y))
    dp = max((abs(float(r[c]) - float(s[c])) for r, s in zip(x, y) for c in pr
              if r[c] not in (None, "") and s[c] not in (None, "")), default=0.0)
    return {"rows": len(x), "winners_equal": equal, "max_dprob": dp}


def main() -> None:
    ap = C.parser(__doc__)
    ap.add_argument("--model", default="qwen3_4b", choices=["qwen3_4b", "qwen3_8b", "tiny"])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--kill", type=int, default=None, metavar="N", help="a run of N actors with one killed")
    ap.add_argument("--kill-after-s", type=float, default=5.0)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    import ray
    work, queries, log = log_in(args.workdir, args.rows, "qcls_bulk_ray_")
    distinct = len(set(q for q in queries if q.strip()))
    overrides, prompts = model_overrides(args.model, work)
    most = max(args.actors + [args.kill or 1])
    cpus = {} if C.joined_ray() else {"num_cpus": max(os.cpu_count() or 1, most + 2)}
    ray.init(include_dashboard=False, log_to_driver=False, **cpus)  # RAY_ADDRESS: joined
    runs: list[tuple[str, dict]] = []
    for n in args.actors:
        runs.append((f"{n}", one_run(log, work, overrides, n, None, args.batch_size)))
        print(json.dumps({n: brief(runs[-1][1])}), flush=True)
    if args.kill:
        killed = one_run(log, work, overrides, args.kill, args.kill_after_s, args.batch_size)
        clean = next((r for k, r in runs if k == str(args.kill)), None)
        killed["vs_clean"] = same_labels(killed["out"], clean["out"], prompts) if clean else None
        runs.append((f"{args.kill}, one killed", killed))
        print(json.dumps({"kill": brief(killed)}, default=str), flush=True)
    ray.shutdown()
    report(args, runs, len(queries), distinct)


def model_overrides(model: str, work: Path) -> tuple[list[str], list[str]]:
    """The run's overrides and its prompts: a random-weight checkpoint of a real shape, or (CPU smoke) the
    tests' tiny Qwen3 with the default prompts."""
    if model == "tiny":
        from qcls.testing.tiny_models import make_tiny_model_dir, tiny_byte_tokenizer
        d = make_tiny_model_dir(work / "tiny", "qwen3", tiny_byte_tokenizer(), seed=1)
        ov = [f"model.path={d}", "model.source=local", "model.name=tiny", "model.head=null", "prompts=default",
              "engine.query_buckets=[16,64]", "max_query_tokens=64", "engine.warmup_requests=1"]
    else:
        from bench.bulk import random_overrides
        ov = random_overrides(model)
    from qcls.config.compose import compose
    return ov, [p.name for p in compose(ov).prompts]


def brief(s: dict) -> dict:
    return {k: s.get(k) for k in ("seconds", "startup_s", "pool_full_s", "classified", "distinct_per_s",
                                  "after_full", "actor_restarts", "kill", "check", "vs_clean")} | {
        "per_actor": [{k: a.get(k) for k in ("pid", "gpus", "ready_s", "first_s", "last_s", "calls", "classified", "busy_share",
                                             "gpu_util")} for a in s["per_actor"]]}


def steady(r: dict, distinct: int) -> float | None:
    """The log's distinct queries per second with the pool full: classifications after it ÷ the duplication."""
    a = r.get("after_full")
    if not a or a["seconds"] <= 0 or not r["classified"]:
        return None
    return a["distinct_per_s"] * distinct / r["classified"]


def report(args, runs: list[tuple[str, dict]], n_rows: int, distinct: int) -> None:
    text = C.header(f"bulk over several GPUs: {n_rows:,} rows through `qcls bulk --ray` ({args.model} random weights, "
                    "ecommerce8)",
                    f"bench/bulk_ray.py --model {args.model} --rows {args.rows} --actors {' '.join(map(str, args.actors))}"
                    f"{f' --kill {args.kill} --kill-after-s {args.kill_after_s:g}' if args.kill else ''}; batch "
                    f"{args.batch_size}; CSV in, Parquet out; one GPU per actor; bench/querylog.py's log")
    text += (f"Log: {n_rows:,} rows, {distinct:,} distinct queries. \"From the first ready\": the rate over the seconds "
             "from the first actor ready to the end (the others' start-up stagger counts against it); \"with the pool "
             "full\": the classifications after the N-th actor was ready over the seconds from then until the output "
             "was written, ÷ the "
             "duplication (classified / the log's distinct queries): the steady state. Scaling: ÷ (N × one actor's).\n\n"
             "| actors | rows | first actor ready / pool full, s | seconds | log distinct/s from the first ready "
             "(scaling) | classified (× distinct) | log distinct/s with the pool full (scaling, goal ≥ 0.9) | "
             "per actor: GPU util % / busy % | restarts | every row once, in order |\n"
             "|---|---|---|---|---|---|---|---|---|---|\n")
    one = next((r for k, r in runs if k == "1"), None)
    for k, r in runs:
        n, dup = r["actors"], r["classified"] / distinct
        rate, full = distinct / r["seconds"], steady(r, distinct)
        scale = (f" ({rate / (n * distinct / one['seconds']):.3f})" if one and "killed" not in k else "")
        fscale = (f" ({full / (n * steady(one, distinct)):.3f})" if one and full and "killed" not in k else "")
        per = ", ".join(f"{a['gpu_util'] if a.get('gpu_util') is not None else '-'} / {a['busy_share'] * 100:.0f}"
                        for a in r["per_actor"])
        ck = r["check"]
        pool = "-" if r["pool_full_s"] is None else f"{r['pool_full_s']:.1f}"
        text += (f"| {k} | {'sorted by query hash' if r['shuffle'] else 'streamed'} | "
                 f"{r['startup_s']:.1f} / {pool} | {r['seconds']:.1f} | {rate:.0f}{scale} | "
                 f"{r['classified']:,} ({dup:.3f}) | {f'{full:.0f}' if full else '-'}{fscale} | {per} | "
                 f"{r['actor_restarts']} | {ck['each_once']}, {ck['in_order']} ({ck['rows_out']:,} of {ck['rows_in']:,}) |\n")
    for k, r in runs:
        if "kill" in r:
            kl, clean = r["kill"], next((c for j, c in runs if j == str(r["actors"])), None)
            lost = f"{r['seconds'] - clean['seconds']:.1f} s" if clean else "-"
            text += (f"\nKilled: actor process {kl['pid']} (SIGKILL) {kl['after_full_s']} s after the pool was full, "
                     f"{kl['rows_then']:,} rows reported by then; its successor ready {kl['restart_s']} s after the "
                     f"kill; the run took {lost} longer than the clean run of {r['actors']} actors. Against that run: "
                     f"{json.dumps(r.get('vs_clean'))}.\n")
    C.report(text, args.no_append)


if __name__ == "__main__":
    main()
