"""The ingress flags and the routed proxy's ReplicaLost middleware, without Ray."""
from __future__ import annotations

import asyncio
import json
import time

import pytest

from qcls.config import ServeSpec
from qcls.deployments.ingress import HEALTH_ANSWER_S, ReplicaLost, serve_env


def test_flags_per_ingress_and_the_environment_wins(monkeypatch):
    for k in serve_env(ServeSpec(ingress="haproxy")):  # the shared Ray's fixture may have exported them
        monkeypatch.delenv(k, raising=False)
    assert serve_env(ServeSpec())["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"
    assert "RAY_SERVE_THROUGHPUT_OPTIMIZED" not in serve_env(ServeSpec(ingress="proxy"))
    haproxy = serve_env(ServeSpec(ingress="haproxy"))
    assert haproxy["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    assert "empty-response" in haproxy["RAY_SERVE_HAPROXY_RETRY_ON"]  # a lost replica's requests are replayed
    assert serve_env(ServeSpec(drain_s=0.5))["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] == "0.5"
    monkeypatch.setenv("RAY_SERVE_THROUGHPUT_OPTIMIZED", "0")
    assert serve_env(ServeSpec())["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "0"


def test_flags_for_a_shell(capsys, monkeypatch):
    from qcls.deployments.ingress import main

    monkeypatch.delenv("RAY_SERVE_ENABLE_HA_PROXY", raising=False)
    main(["serve.ingress=haproxy"])
    out = capsys.readouterr().out
    assert "export RAY_SERVE_ENABLE_HA_PROXY=1" in out and "export RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=" in out


def call(app, path: str = "/v1/classify") -> tuple[list[dict], float]:
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(msg):
        sent.append(msg)

    t0 = time.perf_counter()
    asyncio.run(ReplicaLost(app, retry_after_s=3)({"type": "http", "path": path}, receive, send))
    return sent, time.perf_counter() - t0


async def silent(scope, receive, send):  # what Serve's proxy does when the replica died under a request
    return None


async def answers(scope, receive, send):
    await send({"type": "http.response.start", "status": 500, "headers": []})
    await send({"type": "http.response.body", "body": b'{"detail": "engine"}'})


async def never(scope, receive, send):  # the proxy holding a request while no replica is ready
    await asyncio.Event().wait()  # forever: only the middleware's own timeout ends this call


def test_unanswered_request_gets_503_with_retry_after():
    sent, _ = call(silent)
    assert sent[0]["status"] == 503 and (b"retry-after", b"3") in sent[0]["headers"]
    assert "no replica answered" in json.loads(sent[1]["body"])["detail"]


def test_answers_pass_through_unchanged():
    sent, _ = call(answers)
    assert sent[0]["status"] == 500 and sent[1]["body"] == b'{"detail": "engine"}'


def test_healthz_is_answered_within_a_second_while_no_replica_is_ready():
    # `never` never returns, so an answer at all is the middleware's timeout of HEALTH_ANSWER_S firing (its
    # detail says so); a load balancer's probe waits 1 s. Not timed here against the clock: a busy machine runs late.
    assert HEALTH_ANSWER_S < 1.0
    sent, took = call(never, "/qcls/healthz")
    assert sent[0]["status"] == 503 and took >= HEALTH_ANSWER_S  # it waited for a replica first
    assert "no replica is ready" in json.loads(sent[1]["body"])["detail"]


def test_a_failure_after_the_answer_started_is_not_masked():
    async def breaks(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("connection lost")
    with pytest.raises(RuntimeError):
        call(breaks)
