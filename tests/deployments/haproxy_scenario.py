"""Run by test_haproxy_loss.py in a process of its own: a Ray started with the `serve.ingress=haproxy` flags
(Serve reads them when its processes start, so the tests' shared Ray cannot be reused), two replicas
behind HAProxy, 4 closed-loop clients, one replica's forwards held (inject_fault "hold": a request that reaches
it stays there) and SIGKILLed once a request has reached it; the clients go on until each has sent two
requests after the killed process had exited. No step waits for a time, only for events. Prints one line
`SCENARIO {json}`: when it was killed and when it had exited, which clients had a request held on it, every
request, and HAProxy's log of that time.

    python tests/deployments/haproxy_scenario.py '<json list of config overrides>'
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the repo root is not on the path

import httpx  # noqa: E402
import ray  # noqa: E402
from ray import serve  # noqa: E402  (before export_serve_env: this process keeps Serve's defaults)

from qcls.config.compose import compose  # noqa: E402
from qcls.config import ServeSpec  # noqa: E402
from qcls.deployments.app import app_for  # noqa: E402
from qcls.deployments.ingress import export_serve_env  # noqa: E402
from qcls.testing.replicas import wait_exited  # noqa: E402
from qcls.testing.ports import free_port  # noqa: E402

APP, CLIENTS = "hap", 4
HANG_GUARD_S = 120.0  # a hang guard, never a bound: a request or a wait this long has hung


def isolate_haproxy(log_port: int) -> str:
    """HAProxy's files, its stats/metrics ports and Serve's fallback proxy port default to fixed places per
    host, and each Ray hands out replica ports from 30000 up knowing only its own: give this run its own, so
    it cannot collide with the tests' shared Ray or another run. HAProxy's access log (`option httplog`:
    server, retries, termination state of each request) comes to our UDP socket."""
    d = tempfile.mkdtemp(prefix="qcls-hap-")
    os.environ.update({
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": f"{d}/haproxy.cfg", "RAY_SERVE_HAPROXY_SOCKET_PATH": f"{d}/admin.sock",
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": d, "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": f"{d}/server-state",
        "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": f"{d}/metrics.sock",
        "RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()), "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port()),
        "RAY_SERVE_HAPROXY_LOG_TARGET": f"127.0.0.1:{log_port}",
        "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(free_port()),
        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": "31000", "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": "31500",
        "RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT": "41000", "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT": "41500"})
    return d


def collect(sock: socket.socket, lines: list[str]) -> None:
    while True:
        try:
            data = sock.recv(65536)
        except OSError:  # closed: the run is over
            return
        lines.append(data.decode(errors="replace"))


async def load(url: str, t0: float, doomed_pid: int, arrived: Path) -> tuple[float, float, list[list]]:
    """CLIENTS closed-loop clients; the doomed replica is killed once a request has reached it, and the clients
    stop once each has sent two requests after it had exited. Returns when it was killed, when it had exited,
    and a row per request: [client, start, end, status or exception name, body head]; times in seconds since
    t0."""
    rows: list[list] = []
    done = asyncio.Event()

    async def client(i: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=HANG_GUARD_S) as c:
            while not done.is_set():
                start = time.monotonic() - t0
                try:
                    r = await c.post("/v1/classify", json={"query": f"maxi dress {i}"})
                    rows.append([i, start, time.monotonic() - t0, r.status_code, r.text[:120]])
                except httpx.HTTPError as e:
                    rows.append([i, start, time.monotonic() - t0, type(e).__name__, str(e)[:120]])

    async def wait(cond, what: str) -> None:
        deadline = time.monotonic() + HANG_GUARD_S
        while not cond():
            if time.monotonic() > deadline:
                done.set()
                raise TimeoutError(f"waited {HANG_GUARD_S:g} s (hang guard) for {what}")
            await asyncio.sleep(0.05)

    async def killer() -> tuple[float, float]:
        await wait(lambda: arrived.exists() and arrived.read_text().strip(), "a request to reach the held replica")
        os.kill(doomed_pid, signal.SIGKILL)
        killed = time.monotonic() - t0
        await asyncio.to_thread(wait_exited, doomed_pid)
        exited = time.monotonic() - t0
        await wait(lambda: all(sum(r[0] == i and r[1] > exited for r in rows) >= 2 for i in range(CLIENTS)),
                   "every client to send two requests after the kill")
        done.set()
        return killed, exited

    (killed, exited), *_ = await asyncio.gather(killer(), *(client(i) for i in range(CLIENTS)))
    return killed, exited, rows


def replica_servers() -> list[str]:
    """The replicas in the config HAProxy runs now (Serve writes one per node, under the node's id)."""
    cfg = Path(os.environ["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"])
    text = "".join(p.read_text() for p in cfg.parent.glob(f"*/{cfg.name}"))
    return [w[1] for w in (ln.split() for ln in text.splitlines())
            if len(w) > 1 and w[0] == "server" and w[1].startswith("SERVE_REPLICA")]


def start_ray(tries: int = 3) -> None:
    """A Ray of this process's own. Ray gives its raylet 30 s to register (a constant in ray/_private/node.py): on a
    2-core machine busy with the rest of the suite that can pass; a start that timed out is tried again, said on
    stderr (the scenario's subject is the loss, not Ray's start-up)."""
    for k in range(1, tries + 1):
        try:
            ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
            return
        except Exception as e:  # noqa: BLE001 - only Ray's start-up timeout is retried
            if "timed out during startup" not in str(e) or k == tries:
                raise
            print(f"Ray's start timed out (try {k} of {tries}), starting it again: {e}", file=sys.stderr, flush=True)
            ray.shutdown()


def main() -> None:
    overrides = json.loads(sys.argv[1])
    log_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    log_sock.bind(("127.0.0.1", 0))
    log_lines: list[str] = []
    threading.Thread(target=collect, args=(log_sock, log_lines), daemon=True).start()
    haproxy_dir = isolate_haproxy(log_sock.getsockname()[1])
    export_serve_env(ServeSpec(ingress="haproxy"))

    port = free_port()
    start_ray()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        cfg = compose([*overrides, "engine.query_buckets=[16]", "engine.result_cache_entries=0", "serve.num_replicas=2",
                       "serve.num_cpus=0.25", "serve.fault_injection=true", "serve.health_check_period_s=1"])
        handle = serve.run(app_for(cfg), name=APP, route_prefix=f"/{APP}")
        url, deadline = f"http://127.0.0.1:{port}/{APP}", time.monotonic() + HANG_GUARD_S
        with httpx.Client(base_url=url, timeout=HANG_GUARD_S) as c:  # both replicas behind HAProxy
            while len(replica_servers()) < 2 or \
                    sum(c.post("/v1/classify", json={"query": "warm"}).status_code == 200 for _ in range(4)) < 4:
                assert time.monotonic() < deadline, f"no 2 replicas behind HAProxy (hang guard): {replica_servers()}"
                time.sleep(0.5)
        release = Path(haproxy_dir) / "never-released"  # its forwards stay held until it is killed
        doomed_pid = handle.inject_fault.remote("hold", seconds=HANG_GUARD_S, path=str(release)).result()
        arrived = Path(f"{release}.arrived")
        first_line, t0 = len(log_lines), time.monotonic()
        killed, exited, rows = asyncio.run(load(url, t0, doomed_pid, arrived))
        held = sorted({int(q.rsplit(" ", 1)[1]) for q in arrived.read_text().splitlines() if q.startswith("maxi")})
        time.sleep(0.5)  # for the failure message only: HAProxy logs a request once it ends
        out = {"killed": killed, "exited": exited, "clients": CLIENTS, "held_clients": held, "rows": rows,
               "log": log_lines[first_line:]}
        print("SCENARIO " + json.dumps(out), flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
        log_sock.close()
        shutil.rmtree(haproxy_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
