"""The replicas of a running qcls app as Serve publishes them (process id, state, own HTTP port), for tools
that watch, load or kill them one by one: bench/load.py drives every replica's own port, bench/replica_loss.py
and the fault tests kill one.

    reps = running("qcls", 2, guard_s=120)     # {replica id: Replica}, once 2 are RUNNING with a port
    os.kill(reps[rid].pid, signal.SIGKILL); wait_exited(reps[rid].pid)
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Replica:
    replica_id: str
    pid: int | None
    state: str  # Serve's replica state: STARTING, RUNNING, STOPPING, ...
    port: int | None  # its own HTTP port (direct ingress), None without one
    node_ip: str | None


def replicas(app: str, deployment: str = "QclsClassifier") -> dict[str, Replica]:
    """replica id -> Replica, from Serve's details (its own port from the target groups it publishes)."""
    from ray.serve.context import _get_global_client

    d = _get_global_client().get_serve_details()
    deps = (d.get("applications", {}).get(app) or {}).get("deployments", {})
    reps = (deps.get(deployment) or {}).get("replicas", [])
    ports = {t["name"].rsplit("#", 1)[-1]: t["port"] for g in d.get("target_groups") or []
             if g.get("app_name") == app and g["protocol"] == "HTTP" for t in g["targets"]}
    return {r["replica_id"]: Replica(r["replica_id"], r.get("pid"), r["state"], ports.get(r["replica_id"]),
                                     r.get("node_ip")) for r in reps}


def running(app: str, n: int, guard_s: float = 120.0, with_port: bool = True) -> dict[str, Replica]:
    """The RUNNING replicas (with their own port unless with_port=False) once there are at least n. guard_s
    is only a hang guard: Serve starts replicas when it can, and a loaded machine may take long."""
    deadline = time.monotonic() + guard_s
    while True:
        reps = {k: r for k, r in replicas(app).items() if r.state == "RUNNING" and (r.port or not with_port)}
        if len(reps) >= n:
            return reps
        if time.monotonic() > deadline:
            raise TimeoutError(f"{app}: {len(reps)} of {n} replicas running after {guard_s:g} s (hang guard): "
                               f"{replicas(app)}")
        time.sleep(0.2)


def wait_exited(pid: int, guard_s: float = 60.0) -> None:
    """Until every thread of a killed local process has exited (it can still hold sockets open, and take
    requests, until the last one has closed its files, up to ~0.2 s after SIGKILL). A thread shows Z or X once
    past that; the main thread alone can be a zombie long before. guard_s is a hang guard."""
    deadline = time.monotonic() + guard_s
    while Path(f"/proc/{pid}").exists():
        try:
            if all(Path(f"/proc/{pid}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
                   for t in os.listdir(f"/proc/{pid}/task")):
                return
        except OSError:  # a thread went away while we looked: look again
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"process {pid} has not exited {guard_s:g} s after it was killed (hang guard)")
        time.sleep(0.001)
