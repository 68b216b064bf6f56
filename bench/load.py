"""Load benchmark of the served classifier, on loopback only, bounded in requests and time: one table with the
engine called directly, the DeploymentHandle and HTTP (each replica's own port, Serve's proxy or HAProxy), for
the app it starts in-process from Hydra overrides (`--random-qwen3 SHAPE`: random weights; bench/README.md).
`--reloads N`: N reloads spread over the run, alternating prompts=ecommerce8_fewshot and the app's own prompts;
per reload the command's seconds, the seconds to the first answer from the new configuration (fingerprint),
p99 of the requests started during the swap against outside, peak GPU memory (nvidia-smi, the GPUs it sees) during it.
`--zipf`: queries drawn from bench/querylog.py's log; the hit p50 is over answers with meta.cache == "hit".
`--prediction-log-ab N`: N rounds of a fresh app without, then with the prediction log (every row, every label).

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
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import common as C  # noqa: E402
from bench.querylog import zipf_log  # noqa: E402
from bench.paths import QUERIES, closed_loop, engine_levels, handle_caller, http_caller, pct  # noqa: E402
from qcls.testing.ports import free_port  # noqa: E402

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

    from qcls.deployments.ingress import direct_urls, serve_env
    from qcls.deployments.serve_cli import serve_main
    handle = serve_main(overrides, blocking=False)
    gc.collect()
    gc.freeze()  # the clients' garbage collector need not walk everything imported so far
    s = cfg.serve
    info["ray_env"] = {k: v for k, v in serve_env(s).items() if k.startswith("RAY_SERVE_") and "CALLBACK" not in k}
    routed = f"http://127.0.0.1:{s.port}"
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


def log_ab(a, overrides: list[str]) -> tuple[list[dict], dict]:
    """Rounds of a fresh app without, then with the prediction log (every row and label); `log_rows`: rows written."""
    out, folder = [], Path(tempfile.mkdtemp(prefix="qcls-log-ab-"))
    for k, side in ((k, side) for k in range(a.prediction_log_ab) for side in ("off", "on")):
        on = [f"serve.prediction_log.folder={folder / str(k)}", "serve.prediction_log.all_labels=true"] * (side == "on")
        stats, info = measure(a, [*overrides, *on])
        rows = sum(len(p.read_bytes().splitlines()) for p in (folder / str(k)).glob("part-*"))
        out += [{**st, "path": f"{st['path']} log {side} #{k + 1}", "log_rows": rows} for st in stats]
    return out, info


def log_goals(stats: list[dict]) -> list[str]:
    """The log's cost: req/s (mean of the rounds) with it ≥ 0.97 × without, p99 (median) ≤ 1.1 ×."""
    on, off = ([s for s in stats if f" log {side} #" in s["path"]] for side in ("on", "off"))
    if not (on and off):
        return []
    r, p = (statistics.mean(s["rps"] for s in on) / statistics.mean(s["rps"] for s in off),
            statistics.median(s["p99"] for s in on) / statistics.median(s["p99"] for s in off))
    return [f"prediction log on / off ({sum(s['log_rows'] for s in on)} rows written): req/s × {r:.3f} (≥ 0.97: "
            f"{'met' if r >= 0.97 else 'NOT met'}), p99 × {p:.3f} (≤ 1.1: {'met' if p <= 1.1 else 'NOT met'})"]


def reload_sets(overrides: list[str]) -> list[list[str]]:
    """The two configurations the reloads alternate: the few-shot prompt set, then the app's own."""
    return [[*(o for o in overrides if not o.startswith("prompts=")), "prompts=ecommerce8_fewshot"], overrides]


class Reloads:
    """`n` reloads through `qcls reload`'s own function, spread over `seconds`, with GPU memory sampled meanwhile."""

    def __init__(self, n: int, sets: list[list[str]], seconds: float):
        self.n, self.sets, self.seconds, self.windows, self.memory, self.busy = n, sets, seconds, [], {}, {}
        self.done = threading.Event()  # the load goes on until the last reload has answered for a second

    def run(self) -> None:
        if not self.n:
            return self.done.set()
        import ray
        spawn = multiprocessing.get_context("spawn")  # as `qcls reload` runs: its own process, synchronous handles
        t_start, wall = time.perf_counter(), time.time() - time.perf_counter()
        # utilization beside memory: a build that hangs with the GPU busy (a kernel that never ends) or idle (the
        # host threads stuck) are two different bugs
        with C.GpuSampler(0.2, "memory.used") as gpu, C.GpuSampler(0.5) as util:
            for k in range(self.n):
                time.sleep(max(0.0, t_start + (k + 1) * self.seconds / (self.n + 1) - time.perf_counter()))
                t0, want = time.perf_counter(), self.sets[k % 2]
                p = spawn.Process(target=reload_on, args=(ray.get_runtime_context().gcs_address, want))
                p.start()
                p.join()
                self.windows.append((t0, time.perf_counter(), p.exitcode,
                                     next((o for o in want if o.startswith("prompts=")), "the default prompts")))
            time.sleep(1.0)
        self.done.set()
        mine = set(filter(None, os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")))  # (nvidia-smi lists all)
        for t, gpu, mib in gpu.samples:  # the memory.used of the GPUs this run sees, summed per sample time
            if not mine or gpu in mine:
                self.memory[t - wall] = self.memory.get(t - wall, 0) + int(mib)
        for t, gpu, pct_busy in util.samples:
            if not mine or gpu in mine:
                self.busy[t - wall] = max(self.busy.get(t - wall, 0.0), pct_busy)


def reload_log_lines() -> list[str]:
    """What the replicas logged about each reload (the build, the swap, the replaced one's memory) and a health
    probe that found the device threads stuck (their stacks follow it in the replica's log)."""
    import ray
    time.sleep(2.0)  # the replaced configuration is dropped and its memory given back after the swap
    logs = Path(ray._private.worker._global_node.get_logs_dir_path()) / "serve"
    return [ln.strip() for f in sorted(logs.glob("replica_*.log")) for ln in f.read_text(errors="replace").splitlines()
            if "reload:" in ln or "reload refused" in ln or "health probe:" in ln]


def reload_on(address: str, overrides: list[str]) -> None:
    """`qcls reload OVERRIDES` on this benchmark's cluster (RAY_ADDRESS: another may run on the machine)."""
    os.environ["RAY_ADDRESS"] = address
    from qcls.deployments.reload_cli import reload_main
    sys.exit(reload_main(overrides))


def ops_stats(lv, swaps: Reloads, zipf: bool) -> dict:
    """Per reload window: requests started in it, their p99, seconds to the new fingerprint, peak GPU MiB; the
    p99 outside every window; with a Zipf stream, the cache hits' p50."""
    out = {}
    if zipf:
        hits = sorted(r[0] for r in lv.rows if r[6] == "hit")
        out.update(hits=len(hits), hit_p50=pct(hits, 50))
    if swaps.windows:
        rows, inside, swap_rows = sorted(lv.rows, key=lambda r: r[4]), set(), []
        for t0, t1, exitcode, prompts in swaps.windows:
            old = next((r[5] for r in reversed(rows) if r[4] < t0), None)
            first_new = min((r[4] + r[0] / 1e3 for r in rows if r[4] >= t0 and r[5] != old), default=float("nan"))
            win = [i for i, r in enumerate(rows) if t0 <= r[4] <= t1]
            inside.update(win)
            mem = [m for t, m in sorted(swaps.memory.items()) if t0 <= t <= t1]
            before = [m for t, m in sorted(swaps.memory.items()) if t < t0]
            after = [m for t, m in sorted(swaps.memory.items()) if t > t1 + 0.5] or ["n/a"]
            busy = [u for t, u in sorted(swaps.busy.items()) if t0 <= t <= t1]
            swap_rows.append({"prompts": prompts, "exit": exitcode, "command_s": t1 - t0, "to_new_s": first_new - t0,
                              "requests": len(win), "p99": pct(sorted(rows[i][0] for i in win), 99),
                              "mib": f"{before[-1]} → {max(mem)} → {after[0]}" if mem and before else "n/a",
                              "busy": f"{min(busy):.0f}–{max(busy):.0f}" if busy else "n/a"})
        out.update(swaps=swap_rows, p99_outside=pct(sorted(r[0] for i, r in enumerate(rows) if i not in inside), 99))
    return out


def ops_table(stats: list[dict]) -> str:
    lines = []
    for s in stats:
        if "hit_p50" in s:
            lines.append(f"{s['path']} c={s['concurrency']}: {s['hits']} cache hits, hit p50 {s['hit_p50']:.2f} ms")
        if s.get("swaps"):
            lines += [f"Reloads during {s['path']} c={s['concurrency']}: {s['errors']} failed requests of "
                      f"{s['requests']}; p99 outside the swap windows {s['p99_outside']:.2f} ms", "",
                      "| reload | to | exit | command s | to the new fingerprint s | requests in the window | p99 ms "
                      "| GPU MiB before → peak → 0.5 s after | GPU busy % |", "|---" * 9 + "|"]
            lines += [f"| {k + 1} | {w['prompts']} | {w['exit']} | {w['command_s']:.2f} | {w['to_new_s']:.2f} | "
                      f"{w['requests']} | {w['p99']:.2f} | {w['mib']} | {w['busy']} |" for k, w in enumerate(s["swaps"])]
    return "\n".join(lines) + "\n" if lines else ""


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
    g = goals(stats) + log_goals(stats)
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
    stats, info = log_ab(a, overrides) if a.prediction_log_ab else measure(a, overrides)
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
