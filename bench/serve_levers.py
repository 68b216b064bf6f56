"""The serving levers of issue 10 side by side in one run: each lever is a fresh Ray (Serve reads its flags
when its processes start) running bench/load.py in a subprocess; the chosen configuration (the defaults)
runs first with every path and the engine measured directly, the others with the handle and their HTTP path.

    python bench/serve_levers.py --random-qwen3 qwen3_4b serve.num_gpus=1 prompts=ecommerce8 --out /tmp/levers
    python bench/serve_levers.py                     # CPU demo model (slow forwards: read it for plumbing)

Appends one section to bench/RESULTS.md (and writes it, with every run's rows as JSON, to --out): the chosen
configuration's full table and goals, the levers' c=1 / c=8 numbers, and the response-encoding costs.
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

from bench import load, serve_encode  # noqa: E402
from bench.tails import tail_table  # noqa: E402

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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    a.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if a.random_qwen3:  # written once here, so that no lever's time includes it
        load.random_checkpoint(a.random_qwen3, a.random_dir / a.random_qwen3)
    encode = serve_encode.report(serve_encode.measure(8, 10), 8, 10)
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
    text = report(chosen, runs, encode, a)
    (a.out / "levers.md").write_text(text)
    (a.out / "levers.json").write_text(json.dumps(runs))
    print(text, flush=True)
    if not a.no_append:
        with open(ROOT / "bench" / "RESULTS.md", "a", encoding="utf-8") as f:
            f.write("\n" + text)
    return 0 if chosen and not any(s["errors"] for r in runs for s in r["stats"]) else 1


def report(chosen: dict | None, runs: list[dict], encode: str, a) -> str:
    if chosen is None:
        return "## serving levers (bench/serve_levers.py): the chosen configuration did not run\n"
    from bench.common import commit
    stats, h = chosen["stats"], chosen["header"]
    b1 = next((s["p50"] for s in stats if s["path"] == "engine b1"), None)
    head = {"commit": commit(), "device": h["device"], "overrides": " ".join(a.overrides) or "(defaults)",
            "chosen config": chosen["info"].get("config", ""),
            "tokens per forward (b1)": chosen["info"].get("tokens_per_forward", "?"), "bounds": h["bounds"]}
    g = load.goals(stats)
    return "\n".join([
        f"## serving levers (bench/serve_levers.py), {h['device']}", "", *(f"- {k}: {v}" for k, v in head.items()),
        "", f"### {CHOSEN[0]}", "", load.table(stats), tail_table(stats), "Goals (issue 10):",
        *(f"- {x}" for x in g), "", "### Levers side by side (each a fresh Ray; engine b1 p50 from the chosen run)",
        "", lever_table(runs, b1), *(f"{r['name']}:\n\n{tail_table(r['stats'])}" for r in runs[1:] if tail_table(r["stats"])),
        encode]) + "\n"


if __name__ == "__main__":
    sys.exit(main())
