"""One Ray + Serve per pytest run (starting Ray costs ~10 s), on loopback, with the demo model deployed once."""
from __future__ import annotations

import socket

import httpx
import pytest

from qcls.compose import compose

# engine.max_batch_size=4 is what one forward takes and what @serve.batch gathers.
SERVE_OVERRIDES = ["engine.max_batch_size=4", "serve.fault_injection=true"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def serve_port():
    ray = pytest.importorskip("ray")
    from ray import serve

    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield port
    serve.shutdown()
    ray.shutdown()


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
def base_url(serve_port, handle) -> str:
    return f"http://127.0.0.1:{serve_port}"


@pytest.fixture()
def http(base_url):
    with httpx.Client(base_url=base_url, timeout=120) as c:
        yield c
