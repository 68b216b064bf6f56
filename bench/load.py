"""Load benchmark of the served classifier, on loopback only, bounded in requests and time.

    python bench/load.py                                   # starts the CPU demo app in-process, then measures
    python bench/load.py model=qwen3_4b serve.num_gpus=1   # any Hydra overrides for the app it starts
    python bench/load.py --url http://127.0.0.1:8000       # a running app (loopback addresses only)
    python bench/load.py --random-qwen3 qwen3_4b serve.num_gpus=1   # GPU: random weights, real Qwen3-4B
                                                           # shapes and the real Qwen tokenizer

For concurrency 1, 4 and 8 (--concurrency), closed-loop clients each send single-query POST /v1/classify
requests until --requests requests or --seconds seconds per level. Prints, and appends to bench/RESULTS.md:
throughput, latency p50/p90/p99, errors, mean batch size, and where the time goes: the engine's own time,
queue wait (gathering a batch / waiting for the batch ahead), and HTTP + Serve overhead (the rest).
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import ipaddress
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx

ROOT = Path(__file__).resolve().parents[1]
QUERIES = ["red cotton hoodie for boys", "maxi dress", "slim jeans men", "boys tee", "pregnant woman knit",
           "男童卫衣", "платье женское", "black trench coat women", "girls pleated skirt", "oversized knit"]


def loopback_only(url: str) -> None:
    host = urlparse(url).hostname or ""
    addrs = {ai[4][0] for ai in socket.getaddrinfo(host, None)}
    if not addrs or not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs):
        sys.exit(f"refusing {url}: this benchmark only targets loopback addresses (127.0.0.0/8, ::1)")


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * len(xs) + 0.5) - 1))] if xs else float("nan")


async def level(url: str, conc: int, max_requests: int, max_s: float) -> dict:
    rows, errors, sent = [], [], 0
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(max_connections=conc)) as c:
        async def client(i: int) -> None:
            nonlocal sent
            while sent < max_requests and time.perf_counter() < deadline:
                q = QUERIES[(sent + i) % len(QUERIES)]
                sent += 1
                t0 = time.perf_counter()
                try:
                    r = await c.post("/v1/classify", json={"query": q})
                    ms = (time.perf_counter() - t0) * 1e3
                    if r.status_code != 200:
                        errors.append(f"{r.status_code}: {r.text[:200]}")
                        continue
                    res = r.json()["results"][0]
                    t = res["timings_ms"]
                    rows.append((ms, res["batch_size"], t["total"], t["queue_wait"], t["in_replica"]))
                except httpx.HTTPError as e:
                    errors.append(f"{type(e).__name__}: {e}")

        await asyncio.gather(*(c.post("/v1/classify", json={"query": q}) for q in QUERIES[:conc]))  # warm
        deadline = time.perf_counter() + max_s
        t0 = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(conc)))
        wall = time.perf_counter() - t0
    lat = [r[0] for r in rows]
    mean = lambda i: statistics.fmean(r[i] for r in rows) if rows else float("nan")  # noqa: E731
    return {"concurrency": conc, "requests": len(rows) + len(errors), "errors": len(errors),
            "first_error": errors[0] if errors else "", "wall_s": wall, "rps": len(rows) / wall,
            "p50": pct(lat, 50), "p90": pct(lat, 90), "p99": pct(lat, 99), "batch": mean(1),
            "engine": mean(2), "queue": mean(3),
            "overhead": statistics.fmean(r[0] - r[2] - r[3] for r in rows) if rows else float("nan"),
            "http": statistics.fmean(r[0] - r[4] for r in rows) if rows else float("nan")}


def describe_device(health: dict) -> str:
    dev = health.get("device", "?")
    if dev.startswith("cuda"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=10).stdout.strip().splitlines()
            return f"{dev} ({out[0]})" if out else dev
        except Exception:
            return dev
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else "?"
    return f"{dev} ({cpu}, {os.cpu_count()} cores)"


def random_checkpoint(shape: str, out: Path) -> list[str]:
    """A random-weight checkpoint of a real Qwen3 shape with the real Qwen tokenizer (timings depend on the
    shapes, not on the values), saved once so the replica loads it like any local model."""
    if not (out / "config.json").is_file():
        import torch

        sys.path.insert(0, str(ROOT))
        from bench.common import random_qwen3
        from qcls.qwen_tokenizer import save_qwen_tokenizer
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        t0 = time.perf_counter()
        model = random_qwen3(shape, dev, torch.float16 if dev == "cuda" else torch.float32)
        model.save_pretrained(str(out))
        save_qwen_tokenizer(out)
        del model
        print(f"[bench] random {shape} checkpoint written to {out} in {time.perf_counter() - t0:.0f}s", flush=True)
    return [f"model={shape}", "model.source=local", f"model.path={out}", f"model.name={shape}_random_weights"]


def config_line(overrides: list[str]) -> str:
    from qcls.compose import compose
    c = compose(overrides)
    return (f"engine {c.engine.kind}, max_batch_size={c.engine.max_batch_size}, buckets={c.engine.query_buckets}, "
            f"max_query_tokens={c.max_query_tokens}; serve: {c.serve.num_replicas} replica(s), num_gpus="
            f"{c.serve.num_gpus:g}, num_cpus={c.serve.num_cpus:g}, "
            f"batch_wait_timeout_s={c.serve.batch_wait_timeout_s:g}, max_ongoing_requests={c.max_ongoing_requests}")


def git_commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True,
                               timeout=10).stdout.strip()
        return sha + (" + uncommitted changes" if dirty else "") if sha else "unknown"
    except Exception:
        return "unknown"


def report(stats: list[dict], header: dict, note: str) -> str:
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"## {when}: load bench (bench/load.py), {note}", "",
             *(f"- {k}: {v}" for k, v in header.items()), "",
             "| concurrency | requests | errors | req/s | p50 ms | p90 ms | p99 ms | mean batch | engine ms | "
             "queue wait ms | HTTP+Serve overhead ms | of which proxy+HTTP ms | overhead / engine |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in stats:
        lines.append(f"| {s['concurrency']} | {s['requests']} | {s['errors']} | {s['rps']:.1f} | {s['p50']:.1f} | "
                     f"{s['p90']:.1f} | {s['p99']:.1f} | {s['batch']:.2f} | {s['engine']:.1f} | {s['queue']:.1f} | "
                     f"{s['overhead']:.1f} | {s['http']:.1f} | {s['overhead'] / s['engine']:.0%} |")
    lines += ["", "engine ms: the replica's own classify time per request (timings_ms.total, tokenize..postprocess)."
              " queue wait: arrival at the replica to its batch's start. HTTP+Serve overhead: client latency minus "
              "both (proxy, routing, FastAPI, (de)serialisation, the client itself); proxy+HTTP: client latency "
              "minus time inside the replica.", ""]
    for s in stats:
        if s["first_error"]:
            lines.append(f"First error at concurrency {s['concurrency']}: `{s['first_error']}`")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for the app this script starts")
    ap.add_argument("--url", help="benchmark a running app at this loopback URL instead of starting one")
    ap.add_argument("--concurrency", type=lambda v: [int(x) for x in v.split(",")], default=[1, 4, 8],
                    help="comma-separated client counts (default 1,4,8)")
    ap.add_argument("--requests", type=int, default=300, help="at most this many requests per level")
    ap.add_argument("--seconds", type=float, default=30.0, help="at most this long per level")
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "RESULTS.md")
    ap.add_argument("--note", default="", help="what was run, for the results heading (e.g. 'CPU, demo model')")
    ap.add_argument("--no-append", action="store_true", help="print only")
    ap.add_argument("--random-qwen3", choices=["qwen3_4b", "qwen3_8b"],
                    help="serve a random-weight model of this real shape (written once to --random-dir)")
    ap.add_argument("--random-dir", type=Path, default=Path("/tmp/qcls_random_model"))
    a = ap.parse_args()

    started = False
    if a.url:
        url = a.url.rstrip("/")
        overrides = a.overrides
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        model = random_checkpoint(a.random_qwen3, a.random_dir / a.random_qwen3) if a.random_qwen3 else []
        overrides = [*model, *a.overrides, "serve.host=127.0.0.1", f"serve.port={port}", "serve.route_prefix=/"]
        from qcls.deployments.serve_cli import serve_main
        serve_main(overrides, blocking=False)
        started, url = True, f"http://127.0.0.1:{port}"
    loopback_only(url)
    try:
        health = httpx.get(url + "/healthz", timeout=30).json()
        prompts = httpx.get(url + "/v1/prompts", timeout=30).json()
        stats = []
        for conc in a.concurrency:
            s = asyncio.run(level(url, conc, a.requests, a.seconds))
            stats.append(s)
            print(f"concurrency {conc}: {s['rps']:.1f} req/s, p50 {s['p50']:.1f} ms, p99 {s['p99']:.1f} ms, "
                  f"errors {s['errors']}, mean batch {s['batch']:.2f}, engine {s['engine']:.1f} ms, queue "
                  f"{s['queue']:.1f} ms, overhead {s['overhead']:.1f} ms", flush=True)
    finally:
        if started:
            import ray
            from ray import serve
            serve.shutdown()
            ray.shutdown()
    header = {"device": describe_device(health), "model": f"{health.get('model')} ({prompts['strategy']} scoring, "
              f"{len(prompts['prompts'])} prompts)", "commit": git_commit(),
              "app": "started by this script" if started else f"running app at {url}",
              "overrides": " ".join(overrides) or "(defaults)",
              **({"config": config_line(overrides)} if started else {}),
              "bounds": f"≤ {a.requests} requests and ≤ {a.seconds:g} s per level, single-query requests, "
                        "closed-loop clients on loopback"}
    text = report(stats, header, a.note or health.get("device", ""))
    print(text)
    if not a.no_append:
        with open(a.results, "a", encoding="utf-8") as f:
            f.write(("\n" if a.results.exists() and a.results.stat().st_size else "") + text)
        print(f"appended to {a.results}")
    return 1 if any(s["errors"] for s in stats) else 0


if __name__ == "__main__":
    sys.exit(main())
