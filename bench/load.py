"""Load benchmark of the served classifier, on loopback only, bounded in requests and time: one table with the
engine called directly, the DeploymentHandle and HTTP (each replica's own port, Serve's proxy or HAProxy), for
the app it starts in-process from Hydra overrides (`--random-qwen3 SHAPE`: random weights; bench/README.md).
Under load (bench/load_ops.py): `--reloads N`, N reloads spread over the run, alternating
prompts=ecommerce8_fewshot and the app's own prompts; `--zipf`, queries drawn from bench/querylog.py's log;
`--prediction-log-ab N`, N rounds of a fresh app without, then with the prediction log (every row, every label).

Rows: `engine b1` / `engine b4`: Classifier.classify of 1 and 4 queries in this process once the app has stopped;
`handle`: DeploymentHandle calls; `http ...`: single-query POSTs (bench/http_client.py) to each replica's own
port (client i → replica i mod N) or the proxy. Queue wait = arrival at the replica to its batch's start;
serving = client latency − engine − queue wait; bench CPU = this process's cores (near 1: the clients may be
the limit).
"""
from __future__ import annotations

import asyncio
import datetime as dt
import gc
import json
import os
import platform
import sys
from pathlib import Path

from bench import common as C
from bench.load_ops import (Reloads, log_ab, log_goals, ops_stats, ops_table, reload_goals, reload_log_lines,
                            reload_sets)
from bench.querylog import zipf_log
from bench.paths import QUERIES, closed_loop, engine_levels, handle_caller, http_caller
from qcls.testing.ports import free_port

GOAL_HTTP_MS, GOAL_HANDLE_MS, GOAL_SHARE, GOAL_BATCH = 2.0, 1.0, 0.8, 3.5


def describe_device(cfg) -> str:
    import torch
    where = C.device_name() if cfg.serve.num_gpus > 0 else f"cpu ({platform.machine()})"
    return f"{where} (torch {torch.__version__}; {os.cpu_count()} CPU cores)"


def measure(a, overrides: list[str]) -> tuple[list[dict], dict]:
    """Start the app and drive every path at every concurrency, then the engine levels in this process."""
    from qcls.config.compose import compose
    from qcls.deployments.ingress import export_serve_env
    cfg = compose(overrides)
    stats, info = [], {"config": config_line(cfg)}
    # before ray.serve is imported: the handle caller's router runs with the cluster's Serve flags too
    export_serve_env(cfg.serve)
    import ray
    from ray import serve

    from qcls.cli.serve import direct_urls, serve_main
    from qcls.deployments.ingress import serve_env
    handle = serve_main(overrides, blocking=False)
    gc.collect()
    gc.freeze()  # the clients' garbage collector need not walk everything imported so far
    s = cfg.serve
    info["ray_env"] = {k: v for k, v in serve_env(s).items() if k.startswith("RAY_SERVE_") and "CALLBACK" not in k}
    routed = f"http://127.0.0.1:{s.port}{s.route_prefix.rstrip('/')}"
    paths = []
    if "handle" in a.paths:
        paths.append(("handle", handle_caller(handle)))
    # the replicas' own ports wherever the controller runs direct ingress (also when the environment set it)
    n = s.num_replicas if not s.autoscaling else 1
    direct = direct_urls(s.app_name, "127.0.0.1", wait_s=10 if s.ingress == "direct" else 2, n=n)
    info["replica_ports"] = len(direct)
    routed_name = "http (HAProxy)" if s.ingress == "haproxy" else "http (Serve proxy)"
    ports_name = "http (replica port)" if len(direct) == 1 else f"http ({len(direct)} replica ports)"
    main_url, main_name = (direct, ports_name) if direct else (routed, routed_name)
    if "http" in a.paths:
        paths.append((main_name, http_caller(main_url)))
    if "proxy" in a.paths and direct and not C.joined_ray():  # a joined cluster's proxy port is its own
        paths.append((routed_name, http_caller(routed)))

    queries = [q for q in zipf_log(200_000) if q] if a.zipf else QUERIES

    async def drive() -> None:  # one event loop for every level: Serve's router may be bound to it
        try:
            for name, caller in paths:
                for conc in a.concurrency:
                    swaps = Reloads(a.reloads, reload_sets(overrides), a.seconds)
                    lv, _ = await asyncio.gather(closed_loop(name, conc, caller, a.requests, a.seconds, queries,
                                                             swaps.done), asyncio.to_thread(swaps.run))
                    stats.append({**lv.stats(), **ops_stats(lv, swaps, a.zipf)})
                    st = stats[-1]
                    print(f"[bench] {name} c={conc}: {st['rps']:.1f}/s p50 {st['p50']:.2f} p99 {st['p99']:.2f} ms, "
                          f"batch {st['batch']:.2f}, errors {st['errors']}, bench CPU {st['client_cpu']:.2f} cores",
                          flush=True)
        finally:
            info["reload_log"] = reload_log_lines() if a.reloads else []
            if C.joined_ray():
                await asyncio.to_thread(serve.delete, s.app_name)
            else:
                await serve.shutdown_async()  # on the loop the handle's router lives on
    try:
        asyncio.run(drive())
    finally:
        ray.shutdown()
    if "engine" in a.paths:
        # Last, once the replica is gone: the device is this process's alone, and the clients above ran in a
        # process without a model's worth of Python objects for its garbage collector to walk.
        from qcls.classifier import Classifier
        clf = Classifier(cfg)
        stats[:0] = [lv.stats() for lv in engine_levels(clf, a.requests, a.seconds)]
        info["tokens_per_forward"] = clf.classify(["maxi dress"])[0].meta.get("tokens_per_forward")
    return stats, info


def config_line(c) -> str:
    return (f"engine {c.engine.kind}, max_batch_size={c.engine.max_batch_size}, {len(c.prompts)} prompts, "
            f"strategy {c.strategy}; serve: ingress={c.serve.ingress}, {c.serve.num_replicas} replica(s), "
            f"num_gpus={c.serve.num_gpus:g}, batch_wait_timeout_s={c.serve.batch_wait_timeout_s:g}, "
            f"max_ongoing_requests={c.max_ongoing_requests}")


def goals(stats: list[dict]) -> list[str]:
    """The serving goals (HTTP and the handle near the engine's own latency and rate), checked on this run's
    own engine numbers."""
    get = {(s["path"], s["concurrency"]): s for s in stats}
    b1 = next((s for s in stats if s["path"] == "engine b1"), None)
    b4 = next((s for s in stats if s["path"].startswith("engine b") and s["path"] != "engine b1"), None)
    ports = sorted({p for p, _c in get if p.startswith("http (") and "replica port" in p})
    http = next((p for p in (*ports, "http (HAProxy)", "http (Serve proxy)") if (p, 1) in get), None)
    if not (b1 and b4 and http):
        return []
    out, ok = [], lambda c: "met" if c else "NOT met"  # noqa: E731
    h1, e1 = get[(http, 1)], b1["p50"]
    out.append(f"{http} c=1 p50 {h1['p50']:.2f} ms ≤ engine b1 p50 {e1:.2f} + {GOAL_HTTP_MS:g}: "
               f"{ok(h1['p50'] <= e1 + GOAL_HTTP_MS)}")
    if ("handle", 1) in get:
        hd = get[("handle", 1)]
        out.append(f"handle c=1 p50 {hd['p50']:.2f} ms ≤ engine b1 p50 {e1:.2f} + {GOAL_HANDLE_MS:g}: "
                   f"{ok(hd['p50'] <= e1 + GOAL_HANDLE_MS)}")
    if (http, 8) in get:
        h8 = get[(http, 8)]
        out.append(f"{http} c=8: {h8['rps']:.0f} req/s ≥ {GOAL_SHARE:.0%} of engine b4 {b4['rps']:.0f} q/s "
                   f"({h8['rps'] / b4['rps']:.0%}): {ok(h8['rps'] >= GOAL_SHARE * b4['rps'])}; p99 {h8['p99']:.2f} "
                   f"≤ 2 × p50 {h8['p50']:.2f}: {ok(h8['p99'] <= 2 * h8['p50'])}; errors {h8['errors']}: "
                   f"{ok(h8['errors'] == 0)}; mean batch {h8['batch']:.2f} ≥ {GOAL_BATCH}: "
                   f"{ok(h8['batch'] >= GOAL_BATCH)}")
    return out


def table(stats: list[dict]) -> str:
    e1 = next((s["p50"] for s in stats if s["path"] == "engine b1"), None)
    lines = ["| path | concurrency | requests | errors | req/s | p50 ms | p90 ms | p99 ms | mean batch | queue wait ms "
             "| serving ms | +p50 over engine b1 ms | bench CPU (cores) |", "|---" * 13 + "|"]
    for s in stats:
        client = not s["path"].startswith("engine")
        plus = f"{s['p50'] - e1:+.2f}" if e1 is not None and client else ""
        cpu = f"{s['client_cpu']:.2f}" if client and s.get("client_cpu") is not None else ""
        lines.append(f"| {s['path']} | {s['concurrency']} | {s['requests']} | {s['errors']} | {s['rps']:.1f} | "
                     f"{s['p50']:.2f} | {s['p90']:.2f} | {s['p99']:.2f} | {s['batch']:.2f} | {s['queue']:.2f} | "
                     f"{s['serving']:.2f} | {plus} | {cpu} |")
    lines += [f"First error of {s['path']} c={s['concurrency']}: `{s['first_error']}`" for s in stats if s["errors"]]
    return "\n".join(lines) + "\n"


def report(stats: list[dict], info: dict, header: dict, note: str) -> str:
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = {"commit": C.commit(), **header, "config": info.get("config", ""),
            "tokens per forward (b1)": info.get("tokens_per_forward", "?"),
            "Ray Serve flags": (" ".join(f"{k}={v}" for k, v in info.get("ray_env", {}).items()) or "(none)")
            + "; the benchmark process (the handle caller) has them too"}
    g = goals(stats) + log_goals(stats) + reload_goals(stats, info.get("reload_log", []))
    return "\n".join([f"## {when}: load bench (bench/load.py), {note}", "", *(f"- {k}: {v}" for k, v in head.items()),
                      "", table(stats), ops_table(stats),
                      *(["Replica log, reloads:", "", "```", *info["reload_log"], "```", ""]
                        if info.get("reload_log") else []),
                      *(["Goals (serving at engine speed):", *(f"- {x}" for x in g), ""] if g else [])]) + "\n"


def parse_args(argv=None):
    ap = C.parser(__doc__)
    ints = lambda v: [int(x) for x in v.split(",")]  # noqa: E731
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for the app this script starts")
    ap.add_argument("--concurrency", type=ints, help="default 1,4,8,16; 8 with --reloads or --zipf")
    ap.add_argument("--paths", type=lambda v: set(v.split(",")), default={"engine", "handle", "http", "proxy"},
                    help="any of engine,handle,http,proxy (default all)")
    ap.add_argument("--requests", type=int, help="at most this many requests per level (default 5000; with "
                    "--reloads none: the run lasts --seconds, so that every reload falls inside it)")
    ap.add_argument("--seconds", type=float, default=3.0, help="at most this long per level")
    ap.add_argument("--note", default="", help="what was run, for the results heading")
    ap.add_argument("--json", type=Path, help="also write the rows and run info here")
    ap.add_argument("--random-qwen3", choices=["qwen3_4b", "qwen3_8b", "tiny"], help="serve random weights of this shape")
    ap.add_argument("--reloads", type=int, default=0, help="this many reloads during each HTTP level")
    ap.add_argument("--zipf", action="store_true", help="a Zipf query stream over HTTP, result cache on, then off")
    ap.add_argument("--prediction-log-ab", type=int, default=0, metavar="N", help="N rounds over HTTP of a fresh app "
                    "without, then with the prediction log (every row and label): req/s and p99 per side, their ratios")
    a = ap.parse_args(argv)
    if a.reloads or a.zipf or a.prediction_log_ab:
        a.paths = {"http"}
    a.concurrency = a.concurrency or ([8] if a.reloads or a.zipf or a.prediction_log_ab else [1, 4, 8, 16])
    a.requests = a.requests or (10**9 if a.reloads else 5000)
    return a


def app_overrides(random_qwen3: str | None, overrides: list[str], cache: bool = False) -> list[str]:
    """The app's overrides: the random checkpoint if asked, loopback on a free port, no result cache unless `cache`
    or the overrides set it (the clients repeat a few queries: they would time cache hits, not the engine), and on
    a joined cluster an app and route of the bench's own beside the cluster's apps."""
    model = C.checkpoint_overrides(random_qwen3) if random_qwen3 else []
    if not cache and not any(o.lstrip("+").startswith("engine.result_cache_entries=") for o in overrides):
        model.append("engine.result_cache_entries=0")
    app = ["serve.app_name=bench", "serve.route_prefix=/bench"] if C.joined_ray() else ["serve.route_prefix=/"]
    return [*model, *overrides, "serve.host=127.0.0.1", f"serve.port={free_port()}", *app]


def main(argv=None) -> int:
    a = parse_args(argv)
    overrides = app_overrides(a.random_qwen3, a.overrides, cache=a.zipf)
    from qcls.config.compose import compose
    cfg = compose(overrides)
    stats, info = log_ab(a, overrides, measure) if a.prediction_log_ab else measure(a, overrides)
    if a.zipf:  # the same stream again with the cache off
        off, _ = measure(a, app_overrides(a.random_qwen3, a.overrides))
        stats = [{**st, "path": f"{st['path']} zipf, cache {which}"} for which, sts in (("on", stats), ("off", off))
                 for st in sts]
    header = {"device": describe_device(cfg), "overrides": " ".join(overrides) or "(defaults)",
              "bounds": f"≤ {a.requests} requests and ≤ {a.seconds:g} s per level after 5 warm-up requests per "
                        "client; closed-loop clients, one query per request, on loopback"}
    text = report(stats, info, header, a.note or header["device"])
    if a.json:
        a.json.write_text(json.dumps({"stats": stats, "info": info, "header": header}, default=str))
    C.report(text, a.no_append)
    return 1 if any(s["errors"] or any(w["exit"] for w in s.get("swaps", [])) for s in stats) else 0


if __name__ == "__main__":
    sys.exit(main())
