"""Faults: a query that breaks its batch fails alone; an engine that cannot answer fails check_health, so
Serve replaces the replica."""
from __future__ import annotations

import time

import pytest

from qcls.config.compose import compose
from tests.deployments.helpers import HANG_GUARD_S, assert_no_trace

pytestmark = pytest.mark.slow

POISON = "poisoned query"


def test_a_query_that_breaks_its_batch_fails_alone(handle, http, served_classifier):
    handle.inject_fault.remote("poison", POISON).result()
    try:
        mates = ["maxi dress", "boys tee", "slim jeans men"]
        responses = [handle.classify.remote([q]) for q in [mates[0], POISON, *mates[1:]]]
        results = [r.result()[0] for r in responses]
        bad = results[1]
        assert not bad.ok and "internal error" in bad.error and bad.meta["error_kind"] == "internal"
        for r in results[:1] + results[2:]:
            assert r.ok, r.error
            assert r.winner("category") == served_classifier.classify([r.query])[0].winner("category")

        r = http.post("/v1/classify", json={"query": POISON})
        assert r.status_code == 500 and "injected failure" in r.json()["detail"]
        assert_no_trace(r.text)
        r = http.post("/v1/classify", json={"queries": ["maxi dress", POISON]})
        assert r.status_code == 200 and [x["ok"] for x in r.json()["results"]] == [True, False]
        handle.check_health.remote().result()  # the engine itself is fine: the probe passes
    finally:
        handle.inject_fault.remote(None).result()
    assert http.post("/v1/classify", json={"query": POISON}).status_code == 200


def test_broken_engine_fails_health_and_serve_replaces_the_replica(serve_port, handle, serve_overrides):
    """A separate, small app (batch 1, one bucket: quick to load) so the restart does not touch `qcls`."""
    import httpx
    from ray import serve

    from qcls.deployments.app import app_for

    cfg = compose([*serve_overrides, "engine.max_batch_size=1", "engine.query_buckets=[16]",
                   "engine.result_cache_entries=0", "serve.fault_injection=true", "serve.health_check_period_s=1",
                   "serve.health_check_timeout_s=10"])
    h = serve.run(app_for(cfg), name="faulty", route_prefix="/faulty")
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{serve_port}/faulty", timeout=60) as c:
            assert c.post("/v1/classify", json={"query": "maxi dress"}).status_code == 200
            h.check_health.remote().result()
            h.inject_fault.remote("engine").result()
            r = c.post("/v1/classify", json={"query": "maxi dress"})
            assert r.status_code in (500, 503) and "CUDA error" in r.json()["detail"], r.text
            assert_no_trace(r.text)
            with pytest.raises(Exception, match="engine unusable"):
                h.check_health.remote().result()
            r = c.get("/healthz")
            assert r.status_code == 503 and "CUDA error" in r.json()["detail"]

        # Serve's own periodic check now fails too: the replica is reported unhealthy and replaced.
        seen, deadline = set(), time.monotonic() + HANG_GUARD_S  # a hang guard, not a bound
        replaced = lambda: "UNHEALTHY" in seen and bool(seen & {"STOPPING", "STARTING"})  # noqa: E731
        while not replaced() and time.monotonic() < deadline:
            dep = serve.status().applications["faulty"].deployments["QclsClassifier"]
            seen.add(getattr(dep.status, "value", dep.status))
            seen.update(getattr(s, "value", s) for s, n in dep.replica_states.items() if n)
            time.sleep(0.3)
        assert replaced(), (seen, dep.message)
    finally:
        serve.delete("faulty")
    assert handle.classify.remote(["maxi dress"]).result()[0].ok  # the main app is untouched
