"""A soak on one replica (issue 19): 8 closed-loop clients on the replica's own port for --minutes, and per
minute: requests, errors, p50/p99, and the replica's memory (RSS; on a GPU torch's allocated and reserved bytes
of the replica process, from `replica_stats()`). Goals: 0 errors; memory flat (no minute after the first
more than 1 % above the first); p99 of the last minute within 1.2 × the first's.

    python bench/soak.py --random-qwen3 qwen3_4b serve.num_gpus=1 prompts=ecommerce8 --minutes 8 --budget-s 570
    python bench/soak.py --minutes 2 --minute-s 20        # CPU demo: plumbing only

--budget-s bounds the whole command (the random checkpoint, start-up, the soak, shutdown): the soak runs as many
of --minutes as still fit once the app is up, and the report says how many ran. Progress is printed per
minute. Appends to bench/RESULTS.md; writes soak.md and soak.json to $OUT when set (and to --out).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

T_START = time.perf_counter()
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402

from bench.http_client import KeepAliveClient  # noqa: E402
from bench.paths import QUERIES, WARMUP_PER_CLIENT, pct  # noqa: E402

GOAL_GROWTH, GOAL_P99 = 0.01, 1.2
SHUTDOWN_S = 30  # what the budget keeps for stopping Ray and writing the report
MEMORY = ("rss", "cuda_allocated", "cuda_reserved")


async def soak(url: str, handle, a, minutes: int) -> list[dict]:
    from qcls.deployments.app import classifier_handle
    h = classifier_handle(handle)  # made in this event loop, which makes the calls
    rows: list[tuple[float, float, str | None]] = []  # (end perf_counter, ms, error or None)
    stop = asyncio.Event()

    async def client(i: int) -> None:
        c, k = KeepAliveClient(url), 0
        try:
            try:
                for w in range(WARMUP_PER_CLIENT):
                    await c.post("/v1/classify", orjson.dumps({"query": QUERIES[(i + w) % len(QUERIES)]}))
            except Exception:  # noqa: BLE001 - warm-up only: its requests are not measured
                c.close()
            finally:
                ready.add(i)
                if len(ready) == a.clients:
                    warm.set()
            await warm.wait()
            while not stop.is_set():
                k += 1
                body = orjson.dumps({"query": QUERIES[(i + k) % len(QUERIES)]})
                t0 = time.perf_counter()
                try:
                    status, _h, data = await c.post("/v1/classify", body)
                    err = None if status == 200 else f"{status}: {data[:120].decode(errors='replace')}"
                except Exception as e:  # noqa: BLE001 - counted and reported, the soak goes on
                    err = f"{type(e).__name__}: {e}"[:160]
                rows.append((time.perf_counter(), (time.perf_counter() - t0) * 1e3, err))
        finally:
            c.close()

    ready: set[int] = set()
    warm = asyncio.Event()  # every client warmed up: the first minute starts
    tasks = [asyncio.ensure_future(client(i)) for i in range(a.clients)]
    await warm.wait()
    out, t0 = [], time.perf_counter()
    try:
        for m in range(1, minutes + 1):
            await asyncio.sleep(max(0.0, t0 + m * a.minute_s - time.perf_counter()))
            t1 = time.perf_counter()
            mem = (await h.replica_stats.remote())["memory"]
            mine = [r for r in rows if t0 + (m - 1) * a.minute_s <= r[0] < t0 + m * a.minute_s]
            lat = sorted(r[1] for r in mine if r[2] is None)
            errs = [r[2] for r in mine if r[2]]
            out.append({"minute": m, "requests": len(mine), "errors": len(errs), "first_error": errs[0] if errs else "",
                        "rps": len(lat) / a.minute_s, "p50": pct(lat, 50), "p99": pct(lat, 99), **mem,
                        "at_s": round(t1 - t0, 1)})
            print(f"[soak] minute {m}/{minutes}: {out[-1]['rps']:.0f} req/s, p50 {out[-1]['p50']:.2f} p99 "
                  f"{out[-1]['p99']:.2f} ms, errors {len(errs)}, " + ", ".join(
                      f"{k} {mem[k] / 2**20:.1f} MiB" for k in MEMORY if mem.get(k) is not None), flush=True)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        from ray import serve
        await serve.shutdown_async()  # on the loop the handle's router lives on
    return out


def goals(mins: list[dict], wanted: int) -> list[str]:
    ok = lambda c: "met" if c else "NOT met"  # noqa: E731
    errs = sum(m["errors"] for m in mins)
    out = [f"ran {len(mins)} of {wanted} minutes" + ("" if len(mins) == wanted else " (what fitted --budget-s)"),
           f"errors: {errs}: {ok(errs == 0)}"]
    first, rest, one_minute = mins[0], mins[1:], "not measured (one minute only)"
    for k in MEMORY:
        if first.get(k) is None:
            continue
        top = max((m[k] for m in rest), default=first[k])
        growth = top / first[k] - 1 if first[k] else 0.0
        verdict = ok(growth <= GOAL_GROWTH) if rest else one_minute
        out.append(f"{k}: first minute {first[k] / 2**20:.1f} MiB, highest after it {top / 2**20:.1f} MiB "
                   f"({growth:+.2%}) ≤ +{GOAL_GROWTH:.0%}: {verdict}")
    last = mins[-1]
    verdict = ok(last["p99"] <= GOAL_P99 * first["p99"]) if rest else one_minute
    out.append(f"p99 last minute {last['p99']:.2f} ms ≤ {GOAL_P99:g} × first {first['p99']:.2f} = "
               f"{GOAL_P99 * first['p99']:.2f}: {verdict}")
    return out


def report(mins: list[dict], a, header: dict) -> str:
    from bench.common import commit
    lines = [f"## soak (bench/soak.py), {header['device']}", "", f"- commit: {commit()}",
             *(f"- {k}: {v}" for k, v in header.items()), "",
             "| minute | requests | errors | req/s | p50 ms | p99 ms | RSS MiB | GPU allocated MiB "
             "| GPU reserved MiB |",
             "|---" * 9 + "|"]
    mib = lambda v: "–" if v is None else f"{v / 2**20:.1f}"  # noqa: E731
    for m in mins:
        lines.append(f"| {m['minute']} | {m['requests']} | {m['errors']} | {m['rps']:.1f} | {m['p50']:.2f} | "
                     f"{m['p99']:.2f} | {mib(m['rss'])} | {mib(m['cuda_allocated'])} | {mib(m['cuda_reserved'])} |")
    lines += [f"First error of minute {m['minute']}: `{m['first_error']}`" for m in mins if m["errors"]]
    if mins:
        lines += ["", "Goals (issue 19):", *(f"- {g}" for g in goals(mins, a.minutes))]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from bench import load
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for the app (model, prompts, serve.num_gpus …)")
    ap.add_argument("--minutes", type=int, default=8)
    ap.add_argument("--minute-s", type=float, default=60.0, help="length of a 'minute' (shorter: a quick check)")
    ap.add_argument("--budget-s", type=float, help="the whole command at most this long: fewer minutes if needed")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--random-qwen3", choices=["qwen3_4b", "qwen3_8b"])
    ap.add_argument("--random-dir", type=Path, default=Path("/tmp/qcls_random_model"))
    ap.add_argument("--out", type=Path, help="also write soak.md and soak.json here")
    ap.add_argument("--no-append", action="store_true")
    a = ap.parse_args(argv)
    model = load.random_checkpoint(a.random_qwen3, a.random_dir / a.random_qwen3) if a.random_qwen3 else []
    overrides = [*model, *load.no_result_cache(a.overrides), "serve.host=127.0.0.1", f"serve.port={load.free_port()}",
                 "serve.route_prefix=/"]
    from qcls.compose import compose
    cfg = compose(overrides)
    if cfg.serve.num_replicas != 1 or cfg.serve.autoscaling or cfg.serve.ingress != "direct":
        ap.error("the soak is one replica on its own port: serve.num_replicas=1, no autoscaling, serve.ingress=direct")
    import ray

    from qcls.deployments.ingress import direct_urls
    from qcls.deployments.serve_cli import serve_main
    handle = serve_main(overrides, blocking=False)
    up_s = time.perf_counter() - T_START
    minutes = a.minutes
    if a.budget_s:
        minutes = min(a.minutes, int((a.budget_s - up_s - SHUTDOWN_S) // a.minute_s))
    print(f"[soak] app up {up_s:.0f} s after start; soaking {minutes} of {a.minutes} minutes of {a.minute_s:g} s "
          f"at {a.clients} clients", flush=True)
    mins = []
    try:
        if minutes >= 1:
            [url] = direct_urls(cfg.serve.app_name, "127.0.0.1", wait_s=30)
            mins = asyncio.run(soak(url, handle, a, minutes))
    finally:
        ray.shutdown()
    header = {"device": load.describe_device(cfg), "overrides": " ".join(overrides), "config": load.config_line(cfg),
              "load": f"{a.clients} closed-loop clients on the replica's own port, one query per request, keep-alive; "
                      f"minutes of {a.minute_s:g} s after {WARMUP_PER_CLIENT} warm-up requests per client",
              "start-up": f"{up_s:.0f} s from this script's start to the app ready (random checkpoint included)"}
    text = report(mins, a, header)
    print(text, flush=True)
    for d in filter(None, (a.out, Path(os.environ["OUT"]) if os.environ.get("OUT") else None)):
        d.mkdir(parents=True, exist_ok=True)
        (d / "soak.md").write_text(text)
        (d / "soak.json").write_text(json.dumps({"minutes": mins, "header": header, "goals": goals(mins, a.minutes)
                                                 if mins else []}, default=str))
    if not a.no_append:
        from bench.common import RESULTS
        with open(RESULTS, "a", encoding="utf-8") as f:
            f.write("\n" + text)
    return 0 if mins and all("NOT met" not in g for g in goals(mins, a.minutes)) else 1


if __name__ == "__main__":
    sys.exit(main())
