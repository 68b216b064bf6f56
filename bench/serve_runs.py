"""The serving benchmarks that start a fresh Ray per configuration and run bench/load.py in it (Serve reads its
flags when its processes start): `levers` (issue 10's levers side by side) and `replicas` (issue 19: N replicas,
one GPU each). Run through bench/serve.py (`python bench/serve.py levers …`, `… replicas …`).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import load, serve  # noqa: E402
from bench.tails import tail_table  # noqa: E402

LEVERS_DOC = """The serving levers of issue 10 side by side in one run: each lever is a fresh Ray (Serve reads its flags
when its processes start) running bench/load.py in a subprocess; the chosen configuration (the defaults)
runs first with every path and the engine measured directly, the others with the handle and their HTTP path.

    python bench/serve.py levers --random-qwen3 qwen3_4b serve.num_gpus=1 prompts=ecommerce8 --out /tmp/levers
    python bench/serve.py levers                     # CPU demo model (slow forwards: read it for plumbing)

Appends one section to bench/RESULTS.md (and writes it, with every run's rows as JSON, to --out): the chosen
configuration's full table and goals, the levers' c=1 / c=8 numbers, and the response-encoding costs."""
REPLICAS_DOC = """Serving on N replicas, one GPU each (issue 19): for each N, bench/load.py on a fresh Ray with
`serve.num_replicas=N`, 8 × N closed-loop clients spread over every replica's own port (direct ingress),
then the same through Serve's proxy; one table and the goal "N replicas ≥ 0.9 × N × one replica's rate on
the replica ports".

    python bench/serve.py replicas --random-qwen3 qwen3_4b serve.num_gpus=1 prompts=ecommerce8 --replicas 1,2,4
    python bench/serve.py replicas --replicas 1,2 --seconds 2 --clients-per-replica 2   # CPU demo: plumbing only

A replica count needing more GPUs than this machine has is not run and says so. Appends one section to
bench/RESULTS.md and writes serve_replicas.md/json to --out and to $OUT when set."""


# ---- levers (issue 10) -------------------------------------------------------------------------------------
CHOSEN = ("chosen: direct ingress (RAY_SERVE_THROUGHPUT_OPTIMIZED=1), no idle batch wait, 2 batches in flight "
          "(the next fills while the device is busy)", [], {})
LEVERS = [  # name, overrides, environment of that run's Ray; most telling first (--budget-s may cut the tail)
    ("chosen but one batch at a time (serve.pipeline_depth=1)", ["serve.pipeline_depth=1"], {}),
    ("chosen but the next batch launched as soon as a slot frees (serve.fill_while_busy=false)",
     ["serve.fill_while_busy=false"], {}),
    ("before: Serve's access log on, buffered 1000 records at a time (THROUGHPUT_OPTIMIZED's default)",
     ["serve.access_log=true"], {"RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1000"}),
    ("chosen but Serve's access log on (serve.access_log=true)", ["serve.access_log=true"], {}),
    ("HAProxy + THROUGHPUT_OPTIMIZED, otherwise chosen", ["serve.ingress=haproxy"], {}),
    ("Serve proxy (no flags), otherwise chosen", ["serve.ingress=proxy"], {}),
    ("before: Serve proxy, 5 ms batch wait, 8 ongoing", ["serve.ingress=proxy", "serve.batch_wait_timeout_s=0.005",
                                                         "serve.max_ongoing_requests=8"], {}),
    ("chosen but a 0.5 ms GIL switch interval", ["serve.gil_switch_interval_ms=0.5"], {}),
    ("chosen but 5 ms batch wait (@serve.batch)", ["serve.batch_wait_timeout_s=0.005"], {}),
    ("RAY_SERVE_ENABLE_DIRECT_INGRESS=1 alone, otherwise chosen", ["serve.ingress=proxy"],
     {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1"}),
]


def run_one(name: str, overrides: list[str], env: dict, paths: str, a, idx: int) -> dict | None:
    js = a.work / f"lever{idx}.json"
    cmd = [sys.executable, str(ROOT / "bench" / "load.py"), *a.overrides, *overrides, "--paths", paths,
           "--seconds", str(a.seconds), "--concurrency", a.concurrency if idx == 0 else "1,8",
           "--json", str(js), "--no-append", "--note", name]
    if a.random_qwen3:
        cmd += ["--random-qwen3", a.random_qwen3, "--random-dir", str(a.random_dir)]
    t0 = time.perf_counter()
    print(f"[levers] {name}: {' '.join(overrides) or '(defaults)'} {env or ''}", flush=True)
    limit = a.chosen_timeout_s if idx == 0 else a.lever_timeout_s
    try:
        rc = subprocess.run(cmd, env={**os.environ, **env}, cwd=ROOT, timeout=limit).returncode
    except subprocess.TimeoutExpired:  # report the others rather than lose the whole run
        rc = f"killed after {limit:g}s"
    print(f"[levers] {name}: exit {rc} in {time.perf_counter() - t0:.0f}s", flush=True)
    if not js.exists():
        return None
    res = json.loads(js.read_text())
    res["name"], res["env"] = name, env
    return res


def lever_table(runs: list[dict], engine_b1: float | None) -> str:
    lines = ["| lever | path | c=1 p50 ms | c=1 p50 − engine b1 ms | c=8 req/s | c=8 p50 ms | c=8 p99 ms | "
             "c=8 mean batch | errors |", "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        by = {(s["path"], s["concurrency"]): s for s in r["stats"]}
        for path in dict.fromkeys(s["path"] for s in r["stats"] if not s["path"].startswith("engine")):
            one, eight = by.get((path, 1)), by.get((path, 8))
            f = lambda s, k, spec: format(s[k], spec) if s else "–"  # noqa: E731
            over = f"{one['p50'] - engine_b1:+.2f}" if one and engine_b1 else "–"
            errs = sum(s["errors"] for (p, _c), s in by.items() if p == path)
            lines.append(f"| {r['name']} | {path} | {f(one, 'p50', '.2f')} | {over} | {f(eight, 'rps', '.0f')} | "
                         f"{f(eight, 'p50', '.2f')} | {f(eight, 'p99', '.2f')} | {f(eight, 'batch', '.2f')} | {errs} |")
    return "\n".join(lines) + "\n"


def levers_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="bench/serve.py levers", description=LEVERS_DOC,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every run (model, prompts, num_gpus …)")
    ap.add_argument("--random-qwen3", choices=["qwen3_4b", "qwen3_8b"])
    ap.add_argument("--random-dir", type=Path, default=Path("/tmp/qcls_random_model"))
    ap.add_argument("--seconds", type=float, default=2.0, help="per level")
    ap.add_argument("--concurrency", default="1,4,8,16", help="levels of the chosen configuration's table")
    ap.add_argument("--levers", type=lambda v: [int(x) for x in v.split(",")] if v else [],
                    default=list(range(1, len(LEVERS) + 1)), help="which levers to run after the chosen "
                    "configuration, by number (1-%d; empty: none)" % len(LEVERS))
    ap.add_argument("--budget-s", type=float, default=540, help="start no lever after this many seconds")
    ap.add_argument("--lever-timeout-s", type=float, default=150, help="each lever's run at most this long")
    ap.add_argument("--chosen-timeout-s", type=float, default=300, help="the chosen configuration's run (every "
                    "path, 4 concurrency levels and the engine) at most this long")
    ap.add_argument("--out", type=Path, default=Path("/tmp/qcls_levers"), help="levers.md and levers.json go here")
    ap.add_argument("--work", type=Path, default=Path("/tmp/qcls_levers_work"), help="each run's own JSON")
    ap.add_argument("--no-append", action="store_true")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    a.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if a.random_qwen3:  # written once here, so that no lever's time includes it
        load.random_checkpoint(a.random_qwen3, a.random_dir / a.random_qwen3)
    encode = serve.encode_report(serve.measure(8, 10), 8, 10)
    chosen = run_one(*CHOSEN, "engine,handle,http,compact,proxy", a, 0)
    runs = [chosen] if chosen else []
    for i, (name, ov, env) in enumerate(LEVERS, 1):
        if i not in a.levers:
            continue
        if time.perf_counter() - t0 > a.budget_s:
            print(f"[levers] out of time budget: {name} not run", flush=True)
            continue
        r = run_one(name, ov, env, "handle,http", a, i)
        if r:
            runs.append(r)
    text = levers_report(chosen, runs, encode, a)
    (a.out / "levers.md").write_text(text)
    (a.out / "levers.json").write_text(json.dumps(runs))
    print(text, flush=True)
    if not a.no_append:
        with open(ROOT / "bench" / "RESULTS.md", "a", encoding="utf-8") as f:
            f.write("\n" + text)
    return 0 if chosen and not any(s["errors"] for r in runs for s in r["stats"]) else 1


def levers_report(chosen: dict | None, runs: list[dict], encode: str, a) -> str:
    if chosen is None:
        return "## serving levers (bench/serve.py levers): the chosen configuration did not run\n"
    from bench.common import commit
    stats, h = chosen["stats"], chosen["header"]
    b1 = next((s["p50"] for s in stats if s["path"] == "engine b1"), None)
    head = {"commit": commit(), "device": h["device"], "overrides": " ".join(a.overrides) or "(defaults)",
            "chosen config": chosen["info"].get("config", ""),
            "tokens per forward (b1)": chosen["info"].get("tokens_per_forward", "?"), "bounds": h["bounds"]}
    g = load.goals(stats)
    return "\n".join([
        f"## serving levers (bench/serve.py levers), {h['device']}", "", *(f"- {k}: {v}" for k, v in head.items()),
        "", f"### {CHOSEN[0]}", "", load.table(stats), tail_table(stats), "Goals (issue 10):",
        *(f"- {x}" for x in g), "", "### Levers side by side (each a fresh Ray; engine b1 p50 from the chosen run)",
        "", lever_table(runs, b1), *(f"{r['name']}:\n\n{tail_table(r['stats'])}" for r in runs[1:] if tail_table(r["stats"])),
        encode]) + "\n"


# ---- replicas (issue 19) -----------------------------------------------------------------------------------
GOAL_SCALE = 0.9  # N replicas ≥ this × N × one replica's rate
CLIENT_BOUND = 0.9  # bench CPU (cores) at which the one-process client may be the limit


def visible_gpus() -> int:
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def run_n(n: int, a) -> dict | None:
    """bench/load.py in a subprocess (Serve's flags are read when Ray starts: a fresh Ray per N)."""
    js = a.work / f"replicas{n}.json"
    js.unlink(missing_ok=True)
    cmd = [sys.executable, str(ROOT / "bench" / "load.py"), *a.overrides, f"serve.num_replicas={n}",
           "--paths", "http,proxy", "--concurrency", str(a.clients_per_replica * n), "--seconds", str(a.seconds),
           "--requests", str(a.requests), "--json", str(js), "--no-append", "--note", f"{n} replica(s)"]
    if a.random_qwen3:
        cmd += ["--random-qwen3", a.random_qwen3, "--random-dir", str(a.random_dir)]
    t0 = time.perf_counter()
    print(f"[replicas] N={n}: {a.clients_per_replica * n} clients", flush=True)
    try:
        rc = subprocess.run(cmd, cwd=ROOT, timeout=a.run_timeout_s).returncode
    except subprocess.TimeoutExpired:
        rc = f"killed after {a.run_timeout_s:g}s"
    print(f"[replicas] N={n}: exit {rc} in {time.perf_counter() - t0:.0f}s", flush=True)
    return json.loads(js.read_text()) if js.exists() else None


def rows(runs: dict[int, dict]) -> list[dict]:
    out = []
    for n, r in sorted(runs.items()):
        for s in r["stats"]:
            kind = "proxy" if "proxy" in s["path"] else "ports"
            out.append({"replicas": n, "kind": kind, **s})
    return out


def table(rs: list[dict]) -> str:
    lines = ["| replicas | path | clients | requests | errors | req/s | req/s per replica | p50 ms | p99 ms | "
             "mean batch | bench CPU (cores) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rs:
        lines.append(f"| {r['replicas']} | {r['path']} | {r['concurrency']} | {r['requests']} | {r['errors']} | "
                     f"{r['rps']:.1f} | {r['rps'] / r['replicas']:.1f} | {r['p50']:.2f} | {r['p99']:.2f} | "
                     f"{r['batch']:.2f} | {r.get('client_cpu', float('nan')):.2f} |")
    lines += [f"First error, {r['replicas']} replica(s), {r['path']}: `{r['first_error']}`" for r in rs if r["errors"]]
    return "\n".join(lines) + "\n"


def goals(rs: list[dict], wanted: list[int], ran: set[int], gpus: int, need_gpus: bool) -> list[str]:
    by = {(r["replicas"], r["kind"]): r for r in rs}
    one = by.get((1, "ports"))
    out = []
    for n in wanted:
        if n not in ran:
            why = (f"{n} replicas need {n} GPUs, {gpus} visible (no multi-GPU machine was lent)"
                   if need_gpus and n > gpus else "its run failed (see the log above)")
            out.append(f"N={n}: not measured: {why}")
            continue
        ports, proxy = by.get((n, "ports")), by.get((n, "proxy"))
        if n > 1 and one and ports:
            ok = ports["rps"] >= GOAL_SCALE * n * one["rps"]
            out.append(f"N={n} replica ports: {ports['rps']:.0f} req/s ≥ {GOAL_SCALE:g} × {n} × {one['rps']:.0f} "
                       f"(one replica) = {GOAL_SCALE * n * one['rps']:.0f}: {'met' if ok else 'NOT met'} "
                       f"({ports['rps'] / (n * one['rps']):.0%} of linear); errors {ports['errors']}")
        if proxy and one:
            out.append(f"N={n} through Serve's proxy: {proxy['rps']:.0f} req/s = {proxy['rps'] / (n * one['rps']):.0%} "
                       f"of {n} × one replica's port rate; p50 {proxy['p50']:.2f} ms; errors {proxy['errors']}")
        busy = [r for r in (ports, proxy) if r and r.get("client_cpu", 0) >= CLIENT_BOUND]
        out += [f"N={n} {r['path']}: the benchmark process used {r['client_cpu']:.2f} cores: its clients (one "
                "asyncio process) may be the limit here, not the replicas" for r in busy]
    return out


def replicas_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="bench/serve.py replicas", description=REPLICAS_DOC,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every run (model, prompts, serve.num_gpus …)")
    ap.add_argument("--replicas", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2, 4])
    ap.add_argument("--clients-per-replica", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0, help="per path and replica count")
    ap.add_argument("--requests", type=int, default=100000, help="at most this many per path and replica count")
    ap.add_argument("--random-qwen3", choices=["qwen3_4b", "qwen3_8b"])
    ap.add_argument("--random-dir", type=Path, default=Path("/tmp/qcls_random_model"))
    ap.add_argument("--run-timeout-s", type=float, default=300, help="each replica count's run at most this long")
    ap.add_argument("--out", type=Path, default=Path("/tmp/qcls_replicas"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/qcls_replicas_work"))
    ap.add_argument("--no-append", action="store_true")
    a = ap.parse_args(argv)
    if 1 not in a.replicas:
        ap.error("--replicas must include 1: the goal compares with one replica's rate")
    for d in (a.out, a.work):
        d.mkdir(parents=True, exist_ok=True)
    from qcls.compose import compose
    cfg = compose(list(a.overrides))
    need_gpus, gpus = cfg.serve.num_gpus > 0, visible_gpus()
    if a.random_qwen3:  # written once here, so that no run's time includes it
        load.random_checkpoint(a.random_qwen3, a.random_dir / a.random_qwen3)
    runs = {}
    for n in a.replicas:
        if need_gpus and n * cfg.serve.num_gpus > gpus:
            print(f"[replicas] N={n}: not run, {n * cfg.serve.num_gpus:g} GPUs needed and {gpus} visible", flush=True)
            continue
        r = run_n(n, a)
        if r:
            runs[n] = r
    text = replicas_report(runs, a, goals(rows(runs), a.replicas, set(runs), gpus, need_gpus))
    print(text, flush=True)
    for d in filter(None, (a.out, Path(os.environ["OUT"]) if os.environ.get("OUT") else None)):
        d.mkdir(parents=True, exist_ok=True)
        (d / "serve_replicas.md").write_text(text)
        (d / "serve_replicas.json").write_text(json.dumps({str(n): r for n, r in runs.items()}, default=str))
    if not a.no_append:
        with open(ROOT / "bench" / "RESULTS.md", "a", encoding="utf-8") as f:
            f.write("\n" + text)
    return 0 if runs and not any(s["errors"] for r in runs.values() for s in r["stats"]) else 1


def replicas_report(runs: dict[int, dict], a, goal_lines: list[str]) -> str:
    from bench.common import commit
    first = next(iter(runs.values()), None)
    h = first["header"] if first else {"device": "?", "bounds": "?"}
    head = {"commit": commit(), "device": h["device"], "overrides": " ".join(a.overrides) or "(defaults)",
            "config (N=1 shown)": first["info"].get("config", "") if first else "",
            "clients": f"{a.clients_per_replica} per replica, closed loop, one query per request; over the replica "
                       "ports client i → replica i mod N", "bounds": h["bounds"]}
    return "\n".join([f"## serving on N replicas (bench/serve.py replicas), {h['device']}", "",
                      *(f"- {k}: {v}" for k, v in head.items()), "", table(rows(runs)),
                      "Goals (issue 19):", *(f"- {x}" for x in goal_lines), ""]) + "\n"
