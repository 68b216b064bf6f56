"""One Ray + Serve per pytest run (starting Ray costs ~10 s), on loopback, with the demo model deployed once.

Ray starts with the Serve flags of the default `serve.ingress` (direct ingress), as `qcls serve` starts it:
`base_url` is the replica's own port (the fast path), `proxy_url` Serve's routing proxy."""
from __future__ import annotations

import os

import httpx
import pytest

from qcls.compose import compose
from qcls.deployments.ports import free_port

# engine.max_batch_size=4 is what one forward takes and what @serve.batch gathers. The tests of these apps compare
# served forwards (batching, faults, metrics) with Classifier runs and repeat queries: the result cache off (its
# own tests: test_operations.py).
NO_CACHE = "engine.result_cache_entries=0"
SERVE_OVERRIDES = ["engine.max_batch_size=4", "serve.fault_injection=true", NO_CACHE]


@pytest.fixture(scope="session")
def metrics_port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def serve_port(metrics_port):
    ray = pytest.importorskip("ray")
    from ray import serve

    from qcls.config import ServeSpec
    from qcls.deployments.ingress import export_serve_env

    port = free_port()
    saved = dict(os.environ)
    export_serve_env(ServeSpec())
    ray.init(num_cpus=2, include_dashboard=False, _metrics_export_port=metrics_port)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield port
    serve.shutdown()
    ray.shutdown()
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session")
def serve_cfg(demo_cfg_overrides):
    return compose([*demo_cfg_overrides, *SERVE_OVERRIDES])


@pytest.fixture(scope="session")
def handle(serve_port, serve_cfg):
    """The qcls app at route / (its replica is loaded and warmed when this returns)."""
    from ray import serve

    from qcls.deployments.app import app_for

    return serve.run(app_for(serve_cfg), name="qcls", route_prefix="/")


@pytest.fixture(scope="session")
def proxy_url(serve_port, handle) -> str:
    return f"http://127.0.0.1:{serve_port}"


@pytest.fixture(scope="session")
def base_url(handle) -> str:
    from qcls.deployments.ingress import direct_urls

    [url] = direct_urls("qcls", "127.0.0.1", wait_s=30)
    return url


@pytest.fixture()
def http(base_url):
    with httpx.Client(base_url=base_url, timeout=120) as c:
        yield c
