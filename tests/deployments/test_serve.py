"""Round trips through real Ray Serve on loopback: HTTP and handle results equal `Classifier.classify`, and
concurrent requests are batched into one forward without changing any result."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from qcls.results import QueryResult
from tests.deployments.helpers import HANG_GUARD_S, Hold, assert_same, until, until_async

pytestmark = pytest.mark.slow

QUERIES = ["red cotton hoodie for boys", "maxi dress", "slim jeans men"]
CONCURRENT = ["boys tee", "pregnant woman knit", "red cotton hoodie for boys", "maxi dress"]
UNICODE = ["男童卫衣", "платье женское", "فستان أحمر", "ドレス 赤", "प्रेम", "👗🔥👖", "שמלה",
           "a\x00b\x07c\u200bd\x1b[0m", "\t\n tab\r\n", "Ü\u0301ber"]


def test_http_round_trip_equals_classifier(http, served_classifier):
    r = http.post("/v1/classify", json={"queries": QUERIES})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "tiny"
    # the configuration that answered: the same hash the Classifier computes for these prompts and model
    assert body["fingerprint"] == served_classifier.fingerprint == body["results"][0]["meta"]["fingerprint"]
    local = served_classifier.classify(QUERIES)
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
def test_handle_round_trip_returns_query_results(handle, served_classifier, serialization):
    from qcls.cli.serve import classifier_handle
    h = handle if serialization == "serve default" else classifier_handle(handle)  # plain pickle
    results = h.classify.remote(QUERIES).result()
    assert len(results) == len(QUERIES) and all(isinstance(r, QueryResult) for r in results)
    for served, ref in zip(results, served_classifier.classify(QUERIES)):
        assert served.ok
        assert served.winner("category") == ref.winner("category")
        assert_same(served, ref)
        assert "queue_wait" in served.timings_ms and served.batch_size >= 1
    with pytest.raises(ValueError, match="max_queries_per_request"):  # errors come back through it too
        h.classify.remote(["maxi dress"] * 17).result()
    assert handle.prompts.remote().result() == [{"name": p.name, "labels": list(p.labels)}
                                                for p in served_classifier.cfg.prompts]
    assert handle.metadata.remote().result()["model"] == "tiny"


def test_any_script_emoji_and_control_characters_classify(http, served_classifier):
    r = http.post("/v1/classify", json={"queries": UNICODE})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["query"] for x in results] == UNICODE  # round-trips byte for byte, NULs included
    for served, ref in zip(results, served_classifier.classify(UNICODE)):
        assert served["ok"], served["error"]
        assert_same(served, ref)


def test_four_concurrent_clients_are_batched_and_unchanged(base_url, handle, served_classifier, tmp_path):
    """The first request is held on the device until the three others have reached the replica: they share
    the next forward (no luck with timing needed), and batched results equal unbatched ones."""
    hold = Hold(handle, tmp_path)

    async def scenario():
        async with httpx.AsyncClient(base_url=base_url, timeout=HANG_GUARD_S) as c:
            post = lambda q: asyncio.ensure_future(c.post("/v1/classify", json={"query": q}))  # noqa: E731
            first = post(CONCURRENT[0])
            await until_async(lambda: hold.arrived() == CONCURRENT[:1], "the first request to reach the replica")
            rest = [post(q) for q in CONCURRENT[1:]]
            await until_async(lambda: len(hold.arrived()) == len(CONCURRENT), "the others to reach the replica")
            hold.release()
            return await asyncio.gather(first, *rest)
    try:
        rs = asyncio.run(scenario())
    finally:
        hold.undo()
    assert all(r.status_code == 200 for r in rs), [r.text for r in rs]
    served = [r.json()["results"][0] for r in rs]
    assert [s["batch_size"] for s in served] == [1] + [len(CONCURRENT) - 1] * (len(CONCURRENT) - 1)
    for s in served:
        assert s["timings_ms"]["queue_wait"] >= 0
        assert_same(s, served_classifier.classify([s["query"]])[0])  # batched == unbatched


def test_concurrent_handle_calls_are_batched(handle, served_classifier, tmp_path):
    hold = Hold(handle, tmp_path)
    try:
        first = handle.classify.remote(CONCURRENT[:1])
        until(lambda: len(hold.arrived()) == 1, "the first call to reach the replica")
        rest = [handle.classify.remote([q]) for q in CONCURRENT[1:]]
        until(lambda: len(hold.arrived()) == len(CONCURRENT), "the other calls to reach the replica")
        hold.release()
        results = [r.result()[0] for r in [first, *rest]]
    finally:
        hold.undo()
    assert [r.batch_size for r in results] == [1] + [len(CONCURRENT) - 1] * (len(CONCURRENT) - 1)
    for r in results:
        assert_same(r, served_classifier.classify([r.query])[0])


def test_event_loop_stays_free_during_a_forward(http, handle, base_url, tmp_path):
    """Health checks and small requests are answered while a long multi-batch request is on the device: its
    first forward is held there until they have been answered, so it cannot end first."""
    hold = Hold(handle, tmp_path)
    try:
        with ThreadPoolExecutor(1) as pool:
            long = pool.submit(httpx.post, f"{base_url}/v1/classify", json={"queries": CONCURRENT * 4},
                               timeout=HANG_GUARD_S)
            until(lambda: len(hold.arrived()) == 4 * len(CONCURRENT), "the long request to reach the replica")
            h = http.get("/healthz")
            p = http.get("/v1/prompts")
            assert not long.done()  # still held on the device: answered meanwhile, not after it
            hold.release()
            assert long.result().status_code == 200
    finally:
        hold.undo()
    assert h.status_code == 200 and h.json()["status"] == "ok"
    assert p.status_code == 200


def test_prompts_health_and_docs(http, served_classifier):
    p = http.get("/v1/prompts").json()
    assert p["model"] == "tiny" and p["strategy"] == "trie"
    assert p["prompts"] == [{"name": s.name, "labels": list(s.labels)} for s in served_classifier.cfg.prompts]
    h = http.get("/healthz")
    assert h.status_code == 200 and h.json() == {"status": "ok", "model": "tiny", "device": "cpu",
                                                 "detail": None}
    spec = http.get("/openapi.json").json()
    assert {"/v1/classify", "/v1/prompts", "/healthz"} <= set(spec["paths"])
    body = spec["paths"]["/v1/classify"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(body["properties"]) == {"query", "queries", "compact"}
    for name in ("PromptOut", "CompactPromptOut"):  # abstention is documented: a flag, and a label that may be null
        out = spec["components"]["schemas"][name]["properties"]
        assert out["abstained"]["type"] == "boolean" and "threshold" in out["abstained"]["description"]
        assert {"type": "null"} in out["label"]["anyOf"]
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
        assert [p["abstained"] for p in c["prompts"]] == [p["abstained"] for p in f["prompts"]] == \
            [False] * len(f["prompts"])  # the served head file has no thresholds
        assert [p["prob"] for p in c["prompts"]] == pytest.approx([p["prob"] for p in f["prompts"]], rel=1e-4)


def test_a_lone_request_is_classified_alone(http, proxy_url):
    """A query that finds the engine idle is classified in a batch of its own, on the replica's own port and
    through the proxy. That it starts at once (no idle batch timer, serve.batch_wait_timeout_s=0) is a latency:
    bench/load.py measures it (queue wait at one client); tests/deployments/test_worker.py checks the rule
    that a lone query on an idle device is launched without waiting for company."""
    for url in (str(http.base_url), proxy_url):
        for q in QUERIES + CONCURRENT[:2]:
            r = httpx.post(f"{url}/v1/classify", json={"query": q}, timeout=HANG_GUARD_S)
            assert r.status_code == 200, r.text
            [res] = r.json()["results"]
            assert res["batch_size"] == 1 and 0 <= res["timings_ms"]["queue_wait"] <= res["timings_ms"]["in_replica"]
