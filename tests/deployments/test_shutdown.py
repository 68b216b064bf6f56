"""`qcls serve` stopped by SIGTERM deletes its app gracefully: requests in flight finish with 200. The
process joins the shared Ray (RAY_ADDRESS), so it leaves that cluster and its other apps running."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.deployments.helpers import HANG_GUARD_S, Hold, until

pytestmark = pytest.mark.slow


QUERIES = ("maxi dress", "boys tee", "slim jeans men", "red hoodie")


def app_status(name: str) -> str | None:
    from ray import serve

    app = serve.status().applications.get(name)
    return None if app is None else getattr(app.status, "value", app.status)


def test_sigterm_lets_in_flight_requests_finish(serve_port, proxy_url, handle, serve_overrides, tmp_path):
    import ray
    from ray import serve

    overrides = [*serve_overrides, "engine.query_buckets=[16]", "serve.num_cpus=0.25", "serve.app_name=term",
                 "serve.route_prefix=/term", "serve.fault_injection=true", "serve.host=127.0.0.1",
                 f"serve.port={serve_port}"]
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([sys.executable, "-m", "qcls.cli", "serve", *overrides], env=env, stderr=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, text=True)
    ready, log = threading.Event(), []

    def read():
        for line in p.stderr:
            log.append(line)
            if "[qcls] serving:" in line:
                ready.set()
    threading.Thread(target=read, daemon=True).start()
    try:
        assert ready.wait(2 * HANG_GUARD_S), "".join(log[-30:])  # a hang guard: start-up takes long on 2 cores
        hold = Hold(serve.get_app_handle("term"), tmp_path)
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(httpx.post, f"{proxy_url}/term/v1/classify", json={"query": q},
                                   timeout=HANG_GUARD_S) for q in QUERIES]
            until(lambda: len(hold.arrived()) == len(QUERIES), "the requests to reach the replica")  # in flight
            p.send_signal(signal.SIGTERM)
            until(lambda: app_status("term") in ("DELETING", None), "qcls serve to delete its app")
            hold.release()  # only now can they finish: the app waits for them (Serve's graceful shutdown, 20 s)
            answers = [f.result() for f in futures]
        assert [r.status_code for r in answers] == [200] * 4, [r.text for r in answers]
        assert p.wait(timeout=HANG_GUARD_S) == 0, "".join(log[-30:])  # a hang guard
        assert "term" not in serve.status().applications
        assert handle.classify.remote(["maxi dress"]).result()[0].ok  # the cluster and its other apps live on
    finally:
        if p.poll() is None:
            p.kill()
