"""A replica process killed (kill -9) under load, with a real Ray Serve on a tiny random-weight Qwen3: no request
hangs and none gets a bare 500. Through Serve's proxy (`proxy_url`, which survives the replica) the requests
in flight on it get 503 with Retry-After and the others succeed; on the replica's own port (direct ingress)
the request in flight fails on the closed connection and no new connection is accepted; /healthz answers 503
while no replica is ready.

No assertion is a wall-clock bound (CI machines are shared and busy): the doomed replica's forwards are held
(inject_fault "hold"), so requests are surely in flight on it, and it is killed once they have reached it;
"after the kill" means after the killed process had exited. Timeouts are hang guards only: a request that
hung would end in a timeout exception, which the assertions tell apart from a closed connection or a 503."""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import time

import httpx
import pytest

from qcls.config.compose import compose
from tests.deployments.helpers import HANG_GUARD_S, Hold, until, until_async

pytestmark = pytest.mark.slow

APP, CLIENTS = "lossy", 4


@pytest.fixture(scope="module")
def lossy(serve_port, handle, serve_overrides):
    """Two small replicas (one bucket: quick to load) at /lossy on the shared Ray."""
    from ray import serve

    from qcls.deployments.app import app_for

    cfg = compose([*serve_overrides, "engine.query_buckets=[16]", "engine.result_cache_entries=0",
                   "serve.num_replicas=2", "serve.num_cpus=0.25", "serve.fault_injection=true",
                   "serve.health_check_period_s=1"])
    h = serve.run(app_for(cfg), name=APP, route_prefix=f"/{APP}")
    yield h
    serve.delete(APP)


async def load(url: str, stop: asyncio.Event, rows: list) -> None:
    """CLIENTS closed-loop clients until `stop`; a row per request: (client, start, end, status or exception
    name, headers, body)."""
    async def client(i: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=HANG_GUARD_S) as c:
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    r = await c.post("/v1/classify", json={"query": f"maxi dress {i}"})
                    rows.append((i, t0, time.monotonic(), r.status_code, r.headers, r.text))
                except httpx.HTTPError as e:
                    rows.append((i, t0, time.monotonic(), type(e).__name__, None, str(e)))

    await asyncio.gather(*(client(i) for i in range(CLIENTS)))


def direct_request(port: int) -> tuple[float, int | Exception]:
    """One request to a replica's own port: when it ended, and its status or the exception it raised."""
    try:
        r = httpx.post(f"http://127.0.0.1:{port}/{APP}/v1/classify", json={"query": "boys tee"},
                       timeout=HANG_GUARD_S)
        return time.monotonic(), r.status_code
    except httpx.HTTPError as e:
        return time.monotonic(), e


def test_killing_one_of_two_replicas_fails_only_its_in_flight_requests(proxy_url, lossy, tmp_path):
    from qcls.testing.replicas import running, wait_exited

    reps = running(APP, 2, guard_s=HANG_GUARD_S)
    hold = Hold(lossy, tmp_path)  # the replica this call reached: from now on every request there stays there
    [(doomed_id, doomed)] = [(k, r) for k, r in reps.items() if r.pid == hold.pid]

    async def scenario():
        rows, stop = [], asyncio.Event()
        direct = asyncio.ensure_future(asyncio.to_thread(direct_request, doomed.port))
        routed = asyncio.ensure_future(load(f"{proxy_url}/{APP}", stop, rows))
        # in flight on it: the request to its own port and at least one routed through the proxy
        await until_async(lambda: "boys tee" in (a := hold.arrived()) and any(q.startswith("maxi") for q in a),
                          "a request on the replica's own port and a routed one to reach the held replica")
        os.kill(hold.pid, signal.SIGKILL)
        killed = time.monotonic()
        await asyncio.to_thread(wait_exited, hold.pid)
        exited = time.monotonic()
        direct_end, direct_outcome = await direct
        # every client goes on until it has sent two requests after the exit, which must all succeed
        await until_async(lambda: all(sum(r[0] == i and r[1] > exited for r in rows) >= 2 for i in range(CLIENTS)),
                          "every client to finish two requests started after the killed replica exited")
        stop.set()
        await routed
        return killed, exited, direct_end, direct_outcome, rows

    killed, exited, direct_end, direct_outcome, rows = asyncio.run(scenario())

    # its own port: the request held there failed on the closed connection, not on the client's timeout (a
    # hang would end in httpx.TimeoutException), and only once the replica was killed ...
    assert isinstance(direct_outcome, httpx.TransportError), direct_outcome
    assert not isinstance(direct_outcome, httpx.TimeoutException), direct_outcome
    assert direct_end > killed
    # ... and no new connection is accepted (refused, not left waiting)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", doomed.port), timeout=HANG_GUARD_S).close()

    # the proxy: only requests in flight at the kill failed (started before the killed process had exited,
    # not answered before the kill), each with a 503 that says so and Retry-After; at least the one held there
    table = [(r[0], round(r[1] - killed, 3), round(r[2] - killed, 3), r[3]) for r in rows]
    failed = [r for r in rows if r[3] != 200]
    in_flight = [r for r in rows if r[1] < exited and r[2] > killed]
    assert failed, f"the routed request held on the killed replica did not fail: {table}"
    assert all(r[3] == 503 and r[4].get("retry-after") and "no replica answered" in r[5] for r in failed), failed
    assert all(r in in_flight for r in failed), table
    assert len(failed) <= CLIENTS, table  # closed-loop clients: at most one request each in flight
    after = [r for r in rows if r[1] > exited]
    assert len(after) >= 2 * CLIENTS and all(r[3] == 200 for r in after), table
    # Serve's controller learns of the death by its health check (every second here) or the actor's exit: until
    # then it still lists the replica as RUNNING, so this waits for it, hang-guarded
    from qcls.testing.replicas import replicas
    until(lambda: doomed_id not in {k for k, r in replicas(APP).items() if r.state == "RUNNING"},
          "Serve's controller to stop listing the killed replica as running")


def test_healthz_answers_503_while_no_replica_is_ready(proxy_url, lossy):
    from qcls.testing.replicas import running, wait_exited

    reps = running(APP, 2, guard_s=2 * HANG_GUARD_S)  # both up again: their replacements then start from nothing
    for r in reps.values():
        os.kill(r.pid, signal.SIGKILL)
    for r in reps.values():
        wait_exited(r.pid)
    # Replacements take seconds of CPU (a process, torch, the model, warm-up) before they are ready; these
    # requests take milliseconds.
    with httpx.Client(timeout=HANG_GUARD_S) as c:
        for _ in range(2):
            r = c.get(f"{proxy_url}/{APP}/healthz")
            # the ReplicaLost middleware's 503: without it the proxy holds /healthz until a replacement is
            # ready and then answers 200. That it answers after HEALTH_ANSWER_S (0.5 s, under a load balancer's 1 s)
            # is tested without Ray, in test_ingress.py.
            assert r.status_code == 503 and r.headers.get("retry-after"), r.text
            assert "no replica" in r.json()["detail"], r.text
        for rep in reps.values():  # the dead replicas' own ports refuse (a refusal, not a timeout)
            with pytest.raises(httpx.ConnectError):
                c.get(f"http://127.0.0.1:{rep.port}/{APP}/healthz")
