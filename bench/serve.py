"""The serving benchmarks, one command with modes (issue 27 merged bench/serve_*.py here and in
bench/serve_runs.py; the old command lines are these modes with the same arguments):

    python bench/serve.py levers  [overrides] [--random-qwen3 qwen3_4b] …   # was bench/serve_levers.py
    python bench/serve.py replicas [overrides] --replicas 1,2,4 …           # was bench/serve_replicas.py
    python bench/serve.py floor [--seconds 3] [--append]                     # was bench/serve_floor.py
    python bench/serve.py encode [--prompts 8] [--labels 10]                 # was bench/serve_encode.py

levers / replicas: each configuration a fresh Ray running bench/load.py in a subprocess (bench/serve_runs.py);
floor: Ray Serve's own cost per call with no model; encode: what writing one answer costs (CPU only).
`python bench/serve.py MODE --help` describes each.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.http_client import KeepAliveClient  # noqa: E402
from bench.paths import pct  # noqa: E402
from qcls.deployments.encode import classify_body  # noqa: E402
from qcls.deployments.schemas import ClassifyResponse, QueryOut  # noqa: E402
from qcls.results import LabelScore, PromptResult, QueryResult  # noqa: E402

ENCODE_DOC = """What writing one POST /v1/classify answer costs: the pydantic models (validate the result dicts, then dump)
against orjson straight from the dataclasses (qcls/deployments/encode.py), full and compact, for results
shaped like the benchmark's (N prompts of M labels); and a handle call's result, written and read back with
Serve's default cloudpickle and with the plain pickle qcls's handle asks for. CPU work only: run it on the
serving host.

    python bench/serve.py encode [--prompts 8] [--labels 10]      # prints; the levers mode records it"""
FLOOR_DOC = """What Ray Serve itself costs per call on this host, with no model: a deployment whose method and route
answer at once, reached through a DeploymentHandle and over HTTP to the replica's own port, one client, with
the flags `qcls serve` sets (RAY_SERVE_THROUGHPUT_OPTIMIZED=1 in Ray and in this caller). The difference to
qcls's own handle and HTTP rows in bench/load.py is qcls's share; what this measures is Serve's floor.

    python bench/serve.py floor [--seconds 3]          # prints a table; --append adds it to bench/RESULTS.md"""


# ---- encode: the response encoders -------------------------------------------------------------------------
def fake_result(prompts: int, labels: int) -> QueryResult:
    ps = [PromptResult(f"prompt{p}", "label0", 0.5, [LabelScore(f"label{i}", -1.25 * i, 0.5 / (i + 1), 2)
                                                         for i in range(labels)]) for p in range(prompts)]
    return QueryResult("red cotton hoodie for boys", ps, None, 6, 1,
                       {"tokenize": 0.1, "prepare": 0.2, "forward": 4.0, "score": 0.1, "postprocess": 0.1,
                        "total": 4.5, "queue_wait": 0.01, "in_replica": 4.6},
                       {"engine": "fast", "strategy": "trie", "tokens_per_forward": 126, "graphs": True, "notes": []})


def per_call_us(fn, n: int = 2000) -> float:
    for _ in range(50):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def measure(prompts: int, labels: int) -> dict[str, tuple[float, int]]:
    rs = [fake_result(prompts, labels)]
    pyd = lambda: ClassifyResponse(model="m", results=[QueryOut.of(r) for r in rs]).model_dump_json()  # noqa: E731
    full = lambda: classify_body("m", rs)  # noqa: E731
    compact = lambda: classify_body("m", rs, compact=True)  # noqa: E731
    import pickle

    from ray import cloudpickle
    cp, pk = cloudpickle.dumps(rs), pickle.dumps(rs, pickle.HIGHEST_PROTOCOL)
    handle = [  # a handle call's result: written in the replica, read in the caller
        ("handle: cloudpickle, write + read (Serve's default)", lambda: cloudpickle.loads(cloudpickle.dumps(rs)), cp),
        ("handle: pickle, write + read (qcls's handle)",
         lambda: pickle.loads(pickle.dumps(rs, pickle.HIGHEST_PROTOCOL)), pk)]
    return {**{name: (per_call_us(fn), len(fn())) for name, fn in
               (("pydantic models (before)", pyd), ("orjson, full", full), ("orjson, compact", compact))},
            **{name: (per_call_us(fn), len(data)) for name, fn, data in handle}}


def encode_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="bench/serve.py encode", description=ENCODE_DOC)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--labels", type=int, default=10)
    a = ap.parse_args(argv)
    print(encode_report(measure(a.prompts, a.labels), a.prompts, a.labels))
    return 0


def encode_report(res: dict[str, tuple[float, int]], prompts: int, labels: int) -> str:
    lines = [f"Response encoding, one query, {prompts} prompts × {labels} labels (CPU, per request):", "",
             "| encoder | µs per response | bytes |", "|---|---|---|"]
    lines += [f"| {k} | {us:.1f} | {n} |" for k, (us, n) in res.items()]
    return "\n".join(lines) + "\n"


# ---- floor: Ray Serve with no model ----------------------------------------------------------------------
def build():
    from fastapi import FastAPI, Request
    from fastapi.responses import Response
    from ray import serve

    api = FastAPI()

    @serve.deployment(name="Echo", max_ongoing_requests=64)
    @serve.ingress(api)
    class Echo:
        @api.post("/echo")
        async def echo(self, request: Request) -> Response:
            return Response(await request.body(), media_type="application/json")

        async def call(self, queries: list[str]) -> list[str]:
            return queries

    return Echo.bind()


async def timed(call, seconds: float) -> list[float]:
    for _ in range(20):
        await call()
    out, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        await call()
        out.append((time.perf_counter() - t0) * 1e3)
    return sorted(out)


def floor_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="bench/serve.py floor", description=FLOOR_DOC)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--append", action="store_true")
    a = ap.parse_args(argv)
    os.environ.setdefault("RAY_SERVE_THROUGHPUT_OPTIMIZED", "1")  # before ray.serve is imported, as bench/load.py
    import ray
    from ray import serve

    from qcls.deployments.app import HANDLE_SERIALIZATION
    from qcls.deployments.ingress import direct_urls
    ray.init(include_dashboard=False, log_to_driver=False)
    from bench.load import free_port
    serve.start(http_options={"host": "127.0.0.1", "port": free_port()})
    handle = serve.run(build(), name="echo", route_prefix="/", blocking=False)
    [url] = direct_urls("echo", "127.0.0.1", wait_s=10)[:1] or [None]
    rows = {}

    async def drive() -> None:
        h = handle.options(**HANDLE_SERIALIZATION)
        rows["handle (pickle)"] = await timed(lambda: h.call.remote(["maxi dress"]), a.seconds)
        rows["handle (cloudpickle)"] = await timed(lambda: handle.call.remote(["maxi dress"]), a.seconds)
        if url:
            client = KeepAliveClient(url)
            rows["http (replica port)"] = await timed(lambda: client.post("/echo", b'{"query": "maxi dress"}'),
                                                      a.seconds)
            client.close()
        await serve.shutdown_async()
    try:
        asyncio.run(drive())
    finally:
        ray.shutdown()
    from bench.common import commit
    lines = [f"Ray Serve's own cost per call, no model (bench/serve.py floor, commit {commit()}, one client, "
             f"{os.cpu_count()} CPU cores):", "", "| path | calls | p50 ms | p90 ms | p99 ms |", "|---|---|---|---|---|"]
    lines += [f"| {k} | {len(v)} | {pct(v, 50):.2f} | {pct(v, 90):.2f} | {pct(v, 99):.2f} |" for k, v in rows.items()]
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    if a.append:
        from bench.common import RESULTS
        with open(RESULTS, "a", encoding="utf-8") as f:
            f.write("\n" + text)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    modes = {"encode": encode_main, "floor": floor_main, "levers": None, "replicas": None}
    if not argv or argv[0] not in modes:
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] in ("levers", "replicas"):  # imported here: they start Ray in subprocesses, floor in-process
        from bench import serve_runs
        return (serve_runs.levers_main if argv[0] == "levers" else serve_runs.replicas_main)(argv[1:])
    return modes[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
