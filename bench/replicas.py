"""Serving on N replicas, one GPU each: for each N, bench/load.py on a fresh Ray with
`serve.num_replicas=N`, 8 × N closed-loop clients spread over every replica's own port (direct ingress),
then the same through Serve's proxy (HAProxy with `serve.ingress=haproxy`); one table and the goal "N replicas
≥ 0.9 × N × one replica's rate on its port", for the replica ports and for HAProxy.
A replica count needing more GPUs than there are is not run and says so. Appends to bench/RESULTS.md and
writes replicas.json to $OUT when set."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from bench import common as C

ROOT = Path(__file__).resolve().parents[1]

GOAL_SCALE = 0.9  # N replicas ≥ this × N × one replica's rate
CLIENT_BOUND = 0.9  # bench CPU (cores) at which the one-process client may be the limit


def run_n(n: int, a) -> dict | None:
    """bench/load.py in a subprocess (Serve's flags are read when Ray starts: a fresh Ray per N)."""
    js = a.work / f"replicas{n}.json"
    js.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "bench.load", *a.overrides, f"serve.num_replicas={n}",
           "--paths", "http,proxy", "--concurrency", str(a.clients_per_replica * n), "--seconds", str(a.seconds),
           "--requests", str(a.requests), "--json", str(js), "--no-append", "--note", f"{n} replica(s)"]
    if a.random_qwen3:
        cmd += ["--random-qwen3", a.random_qwen3]
    t0 = time.perf_counter()
    print(f"[replicas] N={n}: {a.clients_per_replica * n} clients", flush=True)
    try:
        rc = subprocess.run(cmd, cwd=ROOT, timeout=a.run_timeout_s).returncode
    except subprocess.TimeoutExpired:
        rc = f"killed after {a.run_timeout_s:g}s"
    print(f"[replicas] N={n}: exit {rc} in {time.perf_counter() - t0:.0f}s", flush=True)
    return json.loads(js.read_text()) if js.exists() else None


def rows(runs: dict[int, dict]) -> list[dict]:
    def kind(path: str) -> str:
        return "ports" if "replica port" in path else "haproxy" if "HAProxy" in path else "proxy"
    return [{"replicas": n, "kind": kind(s["path"]), **s}
            for n, r in sorted(runs.items()) for s in r["stats"]]


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
        ports, proxy, haproxy = by.get((n, "ports")), by.get((n, "proxy")), by.get((n, "haproxy"))
        for name, r in (("replica ports", ports if n > 1 else None), ("HAProxy", haproxy)):
            if r and one:  # the goal of both: N replicas' rate against one replica's own port
                ok = r["rps"] >= GOAL_SCALE * n * one["rps"]
                out.append(f"N={n} {name}: {r['rps']:.0f} req/s ≥ {GOAL_SCALE:g} × {n} × {one['rps']:.0f} (one "
                           f"replica's port) = {GOAL_SCALE * n * one['rps']:.0f}: {'met' if ok else 'NOT met'} "
                           f"({r['rps'] / (n * one['rps']):.0%} of linear); p50 {r['p50']:.2f} ms; "
                           f"errors {r['errors']}")
        if proxy and one:
            out.append(f"N={n} through Serve's proxy: {proxy['rps']:.0f} req/s = {proxy['rps'] / (n * one['rps']):.0%} "
                       f"of {n} × one replica's port rate; p50 {proxy['p50']:.2f} ms; errors {proxy['errors']}")
        busy = [r for r in (ports, proxy, haproxy) if r and r.get("client_cpu", 0) >= CLIENT_BOUND]
        out += [f"N={n} {r['path']}: the benchmark process used {r['client_cpu']:.2f} cores: its clients (one "
                "asyncio process) may be the limit here, not the replicas" for r in busy]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = C.parser(__doc__)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every run (model, prompts, serve.num_gpus …)")
    ap.add_argument("--replicas", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2, 4])
    ap.add_argument("--clients-per-replica", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0, help="per path and replica count")
    ap.add_argument("--requests", type=int, default=100000, help="at most this many per path and replica count")
    ap.add_argument("--random-qwen3", choices=["qwen3_4b", "qwen3_8b", "tiny"])
    ap.add_argument("--run-timeout-s", type=float, default=300, help="each replica count's run at most this long")
    ap.add_argument("--work", type=Path, default=Path("/tmp/qcls_replicas_work"))
    a = ap.parse_args(argv)
    if 1 not in a.replicas:
        ap.error("--replicas must include 1: the goal compares with one replica's rate")
    a.work.mkdir(parents=True, exist_ok=True)
    from qcls.config.compose import compose
    cfg = compose(list(a.overrides))
    import torch
    need_gpus, gpus = cfg.serve.num_gpus > 0, torch.cuda.device_count()
    if a.random_qwen3:  # written once here, so that no run's time includes it
        C.random_checkpoint(a.random_qwen3)
    runs = {}
    for n in a.replicas:
        if need_gpus and n * cfg.serve.num_gpus > gpus:
            print(f"[replicas] N={n}: not run, {n * cfg.serve.num_gpus:g} GPUs needed and {gpus} visible", flush=True)
            continue
        r = run_n(n, a)
        if r:
            runs[n] = r
    text = replicas_report(runs, a, goals(rows(runs), a.replicas, set(runs), gpus, need_gpus))
    C.report(text, a.no_append, "replicas", {str(n): r for n, r in runs.items()})
    return 0 if runs and not any(s["errors"] for r in runs.values() for s in r["stats"]) else 1


def replicas_report(runs: dict[int, dict], a, goal_lines: list[str]) -> str:
    first = next(iter(runs.values()), None)
    h = first["header"] if first else {"device": "?", "bounds": "?"}
    head = {"commit": C.commit(), "device": h["device"], "overrides": " ".join(a.overrides) or "(defaults)",
            "config (N=1 shown)": first["info"].get("config", "") if first else "",
            "clients": f"{a.clients_per_replica} per replica, closed loop, one query per request; over the replica "
                       "ports client i → replica i mod N", "bounds": h["bounds"]}
    return "\n".join([f"## serving on N replicas (bench/replicas.py), {h['device']}", "",
                      *(f"- {k}: {v}" for k, v in head.items()), "", table(rows(runs)),
                      "Goals (N replicas against one):", *(f"- {x}" for x in goal_lines), ""]) + "\n"


if __name__ == "__main__":
    sys.exit(main())
