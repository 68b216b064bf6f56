"""The session's Ray and Serve (tests/conftest.py `ray_session`) with the qcls app deployed once.

Serve runs with the flags of the default `serve.ingress` (direct ingress), as `qcls serve` starts it: `base_url` is
the replica's own port (the fast path), `proxy_url` Serve's routing proxy."""
from __future__ import annotations

import httpx
import pytest

from qcls.config.compose import compose
from tests.conftest import FAST

# engine.max_batch_size=4 is what one forward takes and what @serve.batch gathers. The tests of these apps compare
# served forwards (batching, faults, metrics) with Classifier runs and repeat queries: the result cache off (its
# own tests: test_operations.py).
NO_CACHE = "engine.result_cache_entries=0"
SERVE_OVERRIDES = ["engine.max_batch_size=4", "serve.fault_injection=true", NO_CACHE]


@pytest.fixture(scope="session")
def metrics_port(ray_session) -> int:
    return ray_session.metrics_port


@pytest.fixture(scope="session")
def serve_port(ray_session) -> int:
    return ray_session.port


@pytest.fixture(scope="session")
def serve_overrides(qwen3_qwentok) -> list[str]:
    """The Serve apps' model: a tiny random-weight Qwen3 with the real Qwen tokenizer (their subject is serving:
    batching, faults, reloads, the page, losses, shutdown; the model is the demo tests' subject), the shipped
    default prompts, no head."""
    return [*FAST, f"model.path={qwen3_qwentok}", "model.source=local", "model.name=tiny", "model.head=null",
            "prompts=default"]


@pytest.fixture(scope="session")
def serve_cfg(serve_overrides):
    return compose([*serve_overrides, *SERVE_OVERRIDES])


@pytest.fixture(scope="session")
def served_classifier(serve_cfg):
    """The served configuration in this process: what every served answer is compared with."""
    from qcls.classifier import Classifier
    return Classifier(serve_cfg)


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
    from qcls.cli.serve import direct_urls

    [url] = direct_urls("qcls", "127.0.0.1", wait_s=30)
    return url


@pytest.fixture()
def http(base_url):
    with httpx.Client(base_url=base_url, timeout=120) as c:
        yield c
