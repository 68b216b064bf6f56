"""A replica process killed (kill -9) under load, with a real Ray Serve on the CPU demo model: no request
hangs and none gets a bare 500. Through Serve's proxy (`proxy_url`, which survives the replica) the requests
in flight on it get 503 with Retry-After and the others succeed; on the replica's own port (direct ingress)
the connection closes at once; /healthz answers 503 within a second while no replica is ready."""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import time

import httpx
import pytest

from qcls.compose import compose

pytestmark = pytest.mark.slow

APP, SLOW_S, CLIENTS, LOAD_S = "lossy", 1.5, 4, 4.0


def replicas(app: str) -> dict[str, dict]:
    """replica id -> {pid, state, port (its own HTTP port)} from what Serve publishes."""
    from ray.serve.context import _get_global_client

    d = _get_global_client().get_serve_details()
    reps = d["applications"][app]["deployments"]["QclsClassifier"]["replicas"]
    ports = {t["name"].rsplit("#", 1)[-1]: t["port"] for g in d.get("target_groups") or []
             if g.get("app_name") == app and g["protocol"] == "HTTP" for t in g["targets"]}
    return {r["replica_id"]: {"pid": r.get("pid"), "state": r["state"], "port": ports.get(r["replica_id"])}
            for r in reps}


def wait_ports(app: str, n: int, timeout: float = 30) -> dict[str, dict]:
    deadline = time.monotonic() + timeout
    while True:
        reps = {k: v for k, v in replicas(app).items() if v["state"] == "RUNNING" and v["port"]}
        if len(reps) >= n or time.monotonic() > deadline:
            return reps
        time.sleep(0.3)


@pytest.fixture(scope="module")
def lossy(serve_port, handle, demo_cfg_overrides):
    """Two small replicas (one bucket: quick to load) at /lossy on the shared Ray."""
    from ray import serve

    from qcls.deployments.app import app_for

    cfg = compose([*demo_cfg_overrides, "engine.query_buckets=[16]", "serve.num_replicas=2", "serve.num_cpus=0.25",
                   "serve.fault_injection=true", "serve.health_check_period_s=1"])
    h = serve.run(app_for(cfg), name=APP, route_prefix=f"/{APP}")
    yield h
    serve.delete(APP)


async def load(url: str, seconds: float) -> list[tuple[float, float, int | str, httpx.Headers | None, str]]:
    """CLIENTS closed-loop clients for `seconds`: (start, end, status or exception name, headers, body)."""
    out = []

    async def client(i: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=15) as c:
            while time.monotonic() < stop:
                t0 = time.monotonic()
                try:
                    r = await c.post("/v1/classify", json={"query": f"maxi dress {i}"})
                    out.append((t0, time.monotonic(), r.status_code, r.headers, r.text))
                except httpx.HTTPError as e:
                    out.append((t0, time.monotonic(), type(e).__name__, None, str(e)))

    stop = time.monotonic() + seconds
    await asyncio.gather(*(client(i) for i in range(CLIENTS)))
    return out


def test_killing_one_of_two_replicas_fails_only_its_in_flight_requests(proxy_url, lossy):
    reps = wait_ports(APP, 2)
    assert len(reps) == 2, reps
    doomed_pid = lossy.inject_fault.remote("slow", seconds=SLOW_S).result()  # one replica, now slow
    [(doomed_id, doomed)] = [(k, v) for k, v in reps.items() if v["pid"] == doomed_pid]

    async def scenario():
        # a request in flight on the doomed replica's own port, and 4 clients through the routed proxy
        direct = asyncio.ensure_future(asyncio.to_thread(
            httpx.post, f"http://127.0.0.1:{doomed['port']}/{APP}/v1/classify", json={"query": "boys tee"},
            timeout=15))
        routed = asyncio.ensure_future(load(f"{proxy_url}/{APP}", LOAD_S))
        await asyncio.sleep(0.8)
        os.kill(doomed_pid, signal.SIGKILL)
        killed = time.monotonic()
        try:
            await direct
            direct_outcome = "answered"
        except httpx.HTTPError as e:
            direct_outcome = type(e).__name__
        return killed, time.monotonic() - killed, direct_outcome, await routed

    killed, direct_s, direct_outcome, rows = asyncio.run(scenario())

    # its own port: the connection closed at once, and no new one is accepted
    assert direct_outcome != "answered" and direct_s < 1.0, (direct_outcome, direct_s)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", doomed["port"]), timeout=1).close()

    # the proxy: only requests in flight at the kill failed, each with a 503 that says so and Retry-After
    failed = [r for r in rows if r[2] != 200]
    in_flight = [r for r in rows if r[0] < killed < r[1]]
    assert all(r[2] == 503 and r[3].get("retry-after") and "no replica answered" in r[4] for r in failed), failed
    assert failed and all(r in in_flight for r in failed), (len(failed), len(in_flight))
    assert len(failed) <= CLIENTS
    after = [r for r in rows if r[0] > killed + 1.0]
    assert after and all(r[2] == 200 for r in after), [r[2] for r in after]
    assert doomed_id not in {k for k, v in replicas(APP).items() if v["state"] == "RUNNING"}


def test_healthz_answers_503_within_a_second_while_no_replica_is_ready(proxy_url, lossy):
    reps = wait_ports(APP, 2, timeout=90)  # both up again: their replacements then start from nothing
    assert reps
    for r in reps.values():
        os.kill(r["pid"], signal.SIGKILL)
    time.sleep(0.5)
    with httpx.Client(timeout=5) as c:
        for _ in range(2):
            t0 = time.monotonic()
            r = c.get(f"{proxy_url}/{APP}/healthz")
            took = time.monotonic() - t0
            assert r.status_code == 503 and r.headers.get("retry-after"), r.text
            assert took < 1.0, took  # the bound (the middleware answers after 0.5 s)
        for rep in reps.values():  # the dead replicas' own ports refuse at once
            t0 = time.monotonic()
            with pytest.raises(httpx.ConnectError):
                c.get(f"http://127.0.0.1:{rep['port']}/{APP}/healthz")
            assert time.monotonic() - t0 < 1.0
