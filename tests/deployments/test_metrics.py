"""The replica's Prometheus metrics, read back from Ray's metrics export port after real requests."""
from __future__ import annotations

import re
import time

import httpx
import pytest

from tests.deployments.helpers import HANG_GUARD_S

pytestmark = pytest.mark.slow


def scrape(port: int) -> dict[str, float]:
    """qcls series as {'name{tag=value,...}': value} summed over replicas (Ray's node, worker and replica
    tags dropped)."""
    keep = ("application", "stage", "reason", "kind", "generation", "le")
    out: dict[str, float] = {}
    for line in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=HANG_GUARD_S).text.splitlines():
        m = re.match(r"(ray_qcls_\w+)(?:\{(.*)\})? ([-+.eE\w]+)$", line)
        if m:
            tags = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            key = m.group(1) + "{" + ",".join(f"{k}={tags[k]}" for k in keep if k in tags) + "}"
            out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def key(name: str, **tags: str) -> str:
    return f"ray_qcls_{name}{{" + ",".join(f"{k}={v}" for k, v in {"application": "qcls", **tags}.items()) + "}"


def test_stage_batch_refusal_and_error_metrics_are_exported(http, handle, metrics_port):
    before = scrape(metrics_port)
    assert http.post("/v1/classify", json={"queries": ["maxi dress", "boys tee"]}).status_code == 200
    assert http.post("/v1/classify", json={"query": "   "}).status_code == 422
    assert http.post("/v1/classify", json={"queries": ["a"] * 17}).status_code == 422
    handle.inject_fault.remote("poison", "poisoned for metrics").result()
    try:
        assert http.post("/v1/classify", json={"query": "poisoned for metrics"}).status_code == 500
    finally:
        handle.inject_fault.remote(None).result()
    grew = lambda m, k: m.get(k, 0) - before.get(k, 0)  # noqa: E731
    wanted = {key("queries_total"): 2, key("refused_queries_total", reason="empty"): 1,
              key("refused_queries_total", reason="too_many_queries"): 1,
              key("engine_errors_total", kind="batch"): 1, key("engine_errors_total", kind="query"): 1,
              key("batch_size_count"): 1, key("tokens_per_forward_count"): 1,
              **{key("stage_ms_count", stage=st): 1 for st in ("tokenize", "forward", "score", "postprocess")},
              key("stage_ms_count", stage="queue_wait"): 2}
    deadline = time.monotonic() + HANG_GUARD_S  # Ray exports every few seconds; this is only a hang guard
    while True:
        now = scrape(metrics_port)
        missing = {k: (grew(now, k), v) for k, v in wanted.items() if grew(now, k) < v}
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert not missing, missing
    assert now[key("engine_healthy")] == 1
    assert grew(now, key("stage_ms_sum", stage="forward")) > 0
    assert any(k.startswith(key("stage_ms_bucket", stage="forward")[:-1] + ",le=") for k in now)


def test_garbage_collector_pauses_are_recorded_and_exported(http, handle, metrics_port):
    """Ray Serve collects and freezes the heap once the replica is up: that pause (generation 2) and those
    the requests cause are counted, readable through replica_stats and exported as a histogram."""
    for _ in range(3):
        assert http.post("/v1/classify", json={"queries": ["maxi dress", "boys tee"]}).status_code == 200
    st = handle.replica_stats.remote().result()
    assert isinstance(st["pid"], int) and st["gc"]["count"][2] >= 1
    assert st["memory"]["rss"] > 0 and st["memory"]["cuda_reserved"] is None  # on the CPU: no CUDA memory
    assert all(len(p) == 3 and p[1] >= 0 and p[2] in (0, 1, 2) for p in st["gc"]["recent"])
    deadline = time.monotonic() + HANG_GUARD_S  # a hang guard
    while not any(k.startswith("ray_qcls_gc_pause_ms_count{application=qcls,generation=") for k in scrape(metrics_port)):
        assert time.monotonic() < deadline, "no ray_qcls_gc_pause_ms series exported"
        time.sleep(2)
