"""Round trips through real Ray Serve on loopback: HTTP and handle results equal `Classifier.classify`, and
concurrent requests are batched into one forward without changing any result."""
from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from qcls.results import QueryResult
from tests.deployments.helpers import assert_same

pytestmark = pytest.mark.slow

QUERIES = ["red cotton hoodie for boys", "maxi dress", "slim jeans men"]
CONCURRENT = ["boys tee", "pregnant woman knit", "red cotton hoodie for boys", "maxi dress"]
UNICODE = ["男童卫衣", "платье женское", "فستان أحمر", "ドレス 赤", "प्रेम", "👗🔥👖", "שמלה",
           "a\x00b\x07c\u200bd\x1b[0m", "\t\n tab\r\n", "Ü\u0301ber"]


def test_http_round_trip_equals_classifier(http, demo_classifier):
    r = http.post("/v1/classify", json={"queries": QUERIES})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "smollm2_demo"
    local = demo_classifier.classify(QUERIES)
    assert [x["query"] for x in body["results"]] == QUERIES
    for served, ref in zip(body["results"], local):
        assert served["ok"] and served["error"] is None
        assert_same(served, ref)
        t = served["timings_ms"]
        assert {"tokenize", "prepare", "forward", "score", "postprocess", "total", "queue_wait", "in_replica"} <= set(t)
        assert 0 <= t["queue_wait"] <= t["in_replica"] and t["total"] <= t["in_replica"]
        assert 1 <= served["batch_size"] <= 4

    one = http.post("/v1/classify", json={"query": QUERIES[0]})
    assert one.status_code == 200, one.text
    [served] = one.json()["results"]
    assert_same(served, local[0])


@pytest.mark.parametrize("serialization", ["serve default", "classifier_handle"])
def test_handle_round_trip_returns_query_results(handle, demo_classifier, serialization):
    from qcls.deployments.app import classifier_handle
    h = handle if serialization == "serve default" else classifier_handle(handle)  # plain pickle
    results = h.classify.remote(QUERIES).result()
    assert len(results) == len(QUERIES) and all(isinstance(r, QueryResult) for r in results)
    for served, ref in zip(results, demo_classifier.classify(QUERIES)):
        assert served.ok
        assert served.winner("category") == ref.winner("category")
        assert_same(served, ref)
        assert "queue_wait" in served.timings_ms and served.batch_size >= 1
    with pytest.raises(ValueError, match="max_queries_per_request"):  # errors come back through it too
        h.classify.remote(["maxi dress"] * 17).result()
    assert handle.prompts.remote().result() == [{"name": p.name, "labels": list(p.labels)}
                                                for p in demo_classifier.cfg.prompts]
    assert handle.metadata.remote().result()["model"] == "smollm2_demo"


def test_any_script_emoji_and_control_characters_classify(http, demo_classifier):
    r = http.post("/v1/classify", json={"queries": UNICODE})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["query"] for x in results] == UNICODE  # round-trips byte for byte, NULs included
    for served, ref in zip(results, demo_classifier.classify(UNICODE)):
        assert served["ok"], served["error"]
        assert_same(served, ref)


async def _concurrent_round(base_url: str, queries: list[str]) -> list[dict]:
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as c:
        rs = await asyncio.gather(*(c.post("/v1/classify", json={"query": q}) for q in queries))
    assert all(r.status_code == 200 for r in rs), [r.text for r in rs]
    return [r.json()["results"][0] for r in rs]


def test_four_concurrent_clients_are_batched_and_unchanged(base_url, demo_classifier):
    served = []
    for _ in range(3):
        served += asyncio.run(_concurrent_round(base_url, CONCURRENT))
        if max(s["batch_size"] for s in served) > 1:
            break
    assert max(s["batch_size"] for s in served) > 1, [s["batch_size"] for s in served]
    for s in served:
        assert s["timings_ms"]["queue_wait"] >= 0
        assert_same(s, demo_classifier.classify([s["query"]])[0])  # batched == unbatched


def test_concurrent_handle_calls_are_batched(handle, demo_classifier):
    responses = [handle.classify.remote([q]) for q in CONCURRENT * 2]
    results = [r.result()[0] for r in responses]
    assert max(r.batch_size for r in results) > 1
    for r in results:
        assert_same(r, demo_classifier.classify([r.query])[0])


def test_event_loop_stays_free_during_a_forward(http, base_url):
    """Health checks and small requests are answered while a long multi-batch request runs."""
    done = {}

    def long_request():
        with httpx.Client(base_url=base_url, timeout=120) as c:
            t0 = time.perf_counter()
            done["status"] = c.post("/v1/classify", json={"queries": CONCURRENT * 4}).status_code
            done["s"] = time.perf_counter() - t0

    th = threading.Thread(target=long_request)
    th.start()
    time.sleep(0.15)
    t0 = time.perf_counter()
    h = http.get("/healthz")
    p = http.get("/v1/prompts")
    side = time.perf_counter() - t0
    th.join()
    assert h.status_code == 200 and h.json()["status"] == "ok"
    assert p.status_code == 200
    assert done["status"] == 200
    assert side < done["s"], (side, done["s"])  # answered before the four forwards were over


def test_prompts_health_and_docs(http, demo_classifier):
    p = http.get("/v1/prompts").json()
    assert p["model"] == "smollm2_demo" and p["strategy"] == "trie"
    assert p["prompts"] == [{"name": s.name, "labels": list(s.labels)} for s in demo_classifier.cfg.prompts]
    h = http.get("/healthz")
    assert h.status_code == 200 and h.json() == {"status": "ok", "model": "smollm2_demo", "device": "cpu",
                                                 "detail": None}
    spec = http.get("/openapi.json").json()
    assert {"/v1/classify", "/v1/prompts", "/healthz"} <= set(spec["paths"])
    body = spec["paths"]["/v1/classify"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(body["properties"]) == {"query", "queries", "compact"}
    assert http.get("/docs").status_code == 200


def test_compact_response_has_the_same_winners(http):
    full = http.post("/v1/classify", json={"queries": QUERIES}).json()["results"]
    r = http.post("/v1/classify", json={"queries": QUERIES, "compact": True})
    assert r.status_code == 200, r.text
    compact = r.json()["results"]
    assert len(r.content) < len(http.post("/v1/classify", json={"queries": QUERIES}).content)
    for c, f in zip(compact, full):
        assert c["query"] == f["query"] and c["ok"] and "meta" not in c
        assert [(p["prompt"], p["label"]) for p in c["prompts"]] == [(p["prompt"], p["label"]) for p in f["prompts"]]
        assert all("labels" not in p for p in c["prompts"])
        assert [p["prob"] for p in c["prompts"]] == pytest.approx([p["prob"] for p in f["prompts"]], rel=1e-4)


def test_a_lone_request_is_not_delayed_by_a_batch_timeout(http, proxy_url):
    """serve.batch_wait_timeout_s=0: a query that finds the engine idle starts at once (the old 5 ms gather
    showed up as queue_wait ≥ 5 ms), on the replica's own port and through the proxy."""
    waits = []
    for url in (str(http.base_url), proxy_url):
        for q in QUERIES + CONCURRENT[:2]:
            r = httpx.post(f"{url}/v1/classify", json={"query": q}, timeout=120)
            assert r.status_code == 200, r.text
            waits.append(r.json()["results"][0]["timings_ms"]["queue_wait"])
    assert sorted(waits)[len(waits) // 2] < 2.5, waits
