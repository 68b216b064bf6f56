"""What Ray Serve itself costs per call on this host, with no model: a deployment whose method and route
answer at once, reached through a DeploymentHandle and over HTTP to the replica's own port, one client, with
the flags `qcls serve` sets (RAY_SERVE_THROUGHPUT_OPTIMIZED=1 in Ray and in this caller). The difference to
qcls's own handle and HTTP rows in bench/load.py is qcls's share; what this measures is Serve's floor.

    python bench/serve_floor.py [--seconds 3]          # prints a table; --append adds it to bench/RESULTS.md
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

os.environ.setdefault("RAY_SERVE_THROUGHPUT_OPTIMIZED", "1")  # before ray.serve is imported, as bench/load.py

from bench.http_client import KeepAliveClient  # noqa: E402
from bench.serve_paths import pct  # noqa: E402


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--append", action="store_true")
    a = ap.parse_args()
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
    lines = [f"Ray Serve's own cost per call, no model (bench/serve_floor.py, commit {commit()}, one client, "
             f"{os.cpu_count()} CPU cores):", "", "| path | calls | p50 ms | p90 ms | p99 ms |", "|---|---|---|---|---|"]
    lines += [f"| {k} | {len(v)} | {pct(v, 50):.2f} | {pct(v, 90):.2f} | {pct(v, 99):.2f} |" for k, v in rows.items()]
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    if a.append:
        from bench.common import RESULTS
        with open(RESULTS, "a", encoding="utf-8") as f:
            f.write("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
