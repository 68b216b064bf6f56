"""Run by test_haproxy_loss.py in a process of its own: a Ray started with the `serve.ingress=haproxy` flags
(Serve reads them when its processes start, so the tests' shared Ray cannot be reused), two demo replicas
behind HAProxy, 4 closed-loop clients, one replica slowed (so requests are surely in flight on it) and then
SIGKILLed. Prints one line `SCENARIO {json}`: when it was killed and when it had exited, every request,
and HAProxy's log of that time.

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

from qcls.compose import compose  # noqa: E402
from qcls.config import ServeSpec  # noqa: E402
from qcls.deployments.app import app_for  # noqa: E402
from qcls.deployments.ingress import export_serve_env  # noqa: E402

APP, SLOW_S, CLIENTS, KILL_AT_S, LOAD_S, CLIENT_TIMEOUT_S = "hap", 1.5, 4, 0.8, 5.0, 15.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def client_port(r: httpx.Response) -> int | None:
    try:
        return r.extensions["network_stream"].get_extra_info("client_addr")[1]
    except (KeyError, OSError, TypeError):
        return None


async def load(url: str, t0: float, doomed_pid: int) -> tuple[float, float, list[list]]:
    """CLIENTS closed-loop clients for LOAD_S; the doomed replica is killed KILL_AT_S in. Returns when it was
    killed, when it had exited, and a row per request: [start, end, status or exception name, body head,
    client port (to find the request in HAProxy's log)]; times in seconds since t0."""
    rows: list[list] = []

    async def client(i: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=CLIENT_TIMEOUT_S) as c:
            while time.monotonic() - t0 < LOAD_S:
                start = time.monotonic() - t0
                try:
                    async with c.stream("POST", "/v1/classify", json={"query": f"maxi dress {i}"}) as r:
                        port = client_port(r)  # before the body is read: HAProxy may close the connection then
                        body = (await r.aread()).decode(errors="replace")
                    rows.append([start, time.monotonic() - t0, r.status_code, body[:120], port])
                except httpx.HTTPError as e:
                    rows.append([start, time.monotonic() - t0, type(e).__name__, str(e)[:120], None])

    async def killer() -> tuple[float, float]:
        await asyncio.sleep(KILL_AT_S)
        os.kill(doomed_pid, signal.SIGKILL)
        killed = time.monotonic() - t0
        await asyncio.to_thread(wait_exit, doomed_pid)
        return killed, time.monotonic() - t0

    (killed, exited), *_ = await asyncio.gather(killer(), *(client(i) for i in range(CLIENTS)))
    return killed, exited, rows


def wait_exit(pid: int) -> None:
    """Until every thread of the killed replica has exited: its sockets stay open (and may take requests)
    until the last one has closed its files, up to ~0.2 s after SIGKILL. A thread shows Z or X once past
    that (the main thread alone can be a zombie long before)."""
    while Path(f"/proc/{pid}").exists():
        try:
            if all(Path(f"/proc/{pid}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
                   for t in os.listdir(f"/proc/{pid}/task")):
                return
        except OSError:  # a thread went away while we looked: look again
            pass
        time.sleep(0.001)


def replica_servers() -> list[str]:
    """The replicas in the config HAProxy runs now (Serve writes one per node, under the node's id)."""
    cfg = Path(os.environ["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"])
    text = "".join(p.read_text() for p in cfg.parent.glob(f"*/{cfg.name}"))
    return [w[1] for w in (ln.split() for ln in text.splitlines())
            if len(w) > 1 and w[0] == "server" and w[1].startswith("SERVE_REPLICA")]


def main() -> None:
    overrides = json.loads(sys.argv[1])
    log_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    log_sock.bind(("127.0.0.1", 0))
    log_lines: list[str] = []
    threading.Thread(target=collect, args=(log_sock, log_lines), daemon=True).start()
    haproxy_dir = isolate_haproxy(log_sock.getsockname()[1])
    export_serve_env(ServeSpec(ingress="haproxy"))

    port = free_port()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        cfg = compose([*overrides, "engine.query_buckets=[16]", "serve.num_replicas=2", "serve.num_cpus=0.25",
                       "serve.fault_injection=true", "serve.health_check_period_s=1"])
        handle = serve.run(app_for(cfg), name=APP, route_prefix=f"/{APP}")
        url, deadline = f"http://127.0.0.1:{port}/{APP}", time.monotonic() + 30
        with httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT_S) as c:  # both replicas behind HAProxy
            while len(replica_servers()) < 2 or \
                    sum(c.post("/v1/classify", json={"query": "warm"}).status_code == 200 for _ in range(4)) < 4:
                assert time.monotonic() < deadline, f"HAProxy has not 2 replicas after 30 s: {replica_servers()}"
                time.sleep(0.5)
        doomed_pid = handle.inject_fault.remote("slow", seconds=SLOW_S).result()  # one replica, now slow
        first_line, t0, t0_wall = len(log_lines), time.monotonic(), time.time()
        killed, exited, rows = asyncio.run(load(url, t0, doomed_pid))
        time.sleep(0.5)  # HAProxy logs a request once it ends; the last datagrams are on their way
        out = {"t0_wall": t0_wall, "killed": killed, "exited": exited, "clients": CLIENTS,
               "client_timeout_s": CLIENT_TIMEOUT_S, "rows": rows, "log": log_lines[first_line:]}
        print("SCENARIO " + json.dumps(out), flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
        log_sock.close()
        shutil.rmtree(haproxy_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
