"""Operating a running app on real Ray Serve (the shared Ray, an app of its own with the defaults an operator gets:
the result cache on, an API key): 401 without the key, a repeated query from the cache, a reload under load that
changes the prompt set with no failed request, and refused reloads that leave the old configuration serving."""
from __future__ import annotations

import threading
import uuid

import httpx
import pytest

from qcls.config.compose import ConfigError, compose
from tests.deployments.helpers import HANG_GUARD_S, until

pytestmark = pytest.mark.slow

APP = "ops"
KEY = f"key-{uuid.uuid4().hex}"
AUTH = {"Authorization": f"Bearer {KEY}"}
COLOUR = """# @package _global_
prompts:
  - name: colour
    template: "<|im_start|>system\\nName the colour.<|im_end|>\\n<|im_start|>user\\nquery: {query}<|im_end|>\\n<|im_start|>assistant\\nlabel:"
    labels: [red, blue, green, other]
"""

OTHER_WEIGHTS = "model.path=/models/other"  # another checkpoint: a new deployment, never a reload


@pytest.fixture(scope="module")
def ops(serve_port, serve_overrides, tmp_path_factory):
    from ray import serve

    from qcls.cli.serve import direct_urls
    from qcls.deployments.app import app_for

    # every layer loaded (no head), so a reload to other prompts runs on the same weights
    overrides = [*serve_overrides, "engine.query_buckets=[16]", "engine.max_batch_size=4", "serve.num_cpus=0.25",
                 f"serve.app_name={APP}", f"serve.route_prefix=/{APP}", f"serve.api_key={KEY}"]
    handle = serve.run(app_for(compose(overrides), overrides), name=APP, route_prefix=f"/{APP}")
    [url] = direct_urls(APP, "127.0.0.1", wait_s=30)
    folder = tmp_path_factory.mktemp("ops")
    (folder / "colour.yaml").write_text(COLOUR)
    (folder / "clash.yaml").write_text(COLOUR + "    label_end: two words\n")
    yield {"handle": handle, "url": url, "proxy": f"http://127.0.0.1:{serve_port}/{APP}", "overrides": overrides,
           "colour": str(folder / "colour.yaml"), "clash": str(folder / "clash.yaml")}
    serve.delete(APP)


def classify(url: str, query: str) -> dict:
    r = httpx.post(f"{url}/v1/classify", json={"query": query}, headers=AUTH, timeout=HANG_GUARD_S)
    assert r.status_code == 200, r.text
    return r.json()


def test_every_route_but_healthz_needs_the_key(ops):
    for url in (ops["url"], ops["proxy"]):  # the replica's own port and Serve's proxy
        for method, path in (("POST", "/v1/classify"), ("GET", "/v1/prompts"), ("GET", "/openapi.json")):
            body = {"json": {"query": "maxi dress"}} if method == "POST" else {}
            r = httpx.request(method, url + path, timeout=HANG_GUARD_S, **body)
            assert r.status_code == 401 and "Bearer" in r.json()["detail"], (url, path, r.text)
            wrong = httpx.request(method, url + path, headers={"Authorization": "Bearer nope"}, timeout=HANG_GUARD_S,
                                  **body)
            assert wrong.status_code == 401
            assert httpx.request(method, url + path, headers=AUTH, timeout=HANG_GUARD_S, **body).status_code == 200
        assert httpx.get(url + "/healthz", timeout=HANG_GUARD_S).status_code == 200
    schema = httpx.get(ops["url"] + "/openapi.json", headers=AUTH, timeout=HANG_GUARD_S).json()
    assert schema["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"


def test_a_repeated_query_is_a_cache_hit_with_the_same_probabilities(ops):
    query = f"red cotton hoodie {uuid.uuid4().hex[:6]}"
    first, again = classify(ops["url"], query), classify(ops["url"], query)
    a, b = first["results"][0], again["results"][0]
    assert (a["meta"]["cache"], b["meta"]["cache"]) == ("miss", "hit")
    assert b["batch_size"] == 0 and b["timings_ms"]["queue_wait"] == 0 and "forward" not in b["timings_ms"]
    assert first["fingerprint"] == again["fingerprint"] == a["meta"]["fingerprint"] == b["meta"]["fingerprint"]
    assert [[lab["prob"] for lab in p["labels"]] for p in a["prompts"]] == \
           [[lab["prob"] for lab in p["labels"]] for p in b["prompts"]]
    stats = ops["handle"].metadata.remote().result()["result_cache"]
    assert stats["hits"] >= 1 and stats["entries"] >= 1


def test_cache_and_reload_counters_are_exported(ops, metrics_port):
    from tests.deployments.test_metrics import scrape

    def key(name: str, **tags: str) -> str:
        return f"ray_qcls_{name}{{" + ",".join(f"{k}={v}" for k, v in {"application": APP, **tags}.items()) + "}"

    before = scrape(metrics_port)
    query = f"slim jeans {uuid.uuid4().hex[:6]}"
    classify(ops["url"], query), classify(ops["url"], query)
    wanted = {key("result_cache_hits_total"): 1, key("result_cache_misses_total"): 1}
    grew = lambda m, k: m.get(k, 0) - before.get(k, 0)  # noqa: E731

    def exported():
        m = scrape(metrics_port)
        return m if all(grew(m, k) >= v for k, v in wanted.items()) else None
    now = until(exported, "the cache counters' export", every_s=1)  # Ray exports every few seconds
    assert now[key("result_cache_entries")] >= 1


def test_a_reload_under_load_changes_the_prompt_set_without_a_failed_request(ops):
    from qcls.cli.reload import reload_main

    before = httpx.get(ops["url"] + "/v1/prompts", headers=AUTH, timeout=HANG_GUARD_S).json()
    rows: list[tuple[int | str, list[str], str | None]] = []
    stop = threading.Event()

    def client(i: int) -> None:  # closed loop: the next request once the last is answered
        with httpx.Client(base_url=ops["url"], headers=AUTH, timeout=HANG_GUARD_S) as c:
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    r = c.post("/v1/classify", json={"query": f"maxi dress {i} {n}"})
                    res = r.json()["results"][0] if r.status_code == 200 else {}
                    rows.append((r.status_code, [p["prompt"] for p in res.get("prompts", [])],
                                 r.json().get("fingerprint") if r.status_code == 200 else r.text))
                except httpx.HTTPError as e:
                    rows.append((type(e).__name__, [], str(e)))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    until(lambda: len(rows) >= 2, "the clients' first answers")
    assert reload_main([*ops["overrides"], f"prompts={ops['colour']}"]) == 0
    served = len(rows)
    until(lambda: len(rows) >= served + 2, "answers after the reload")
    stop.set()
    for t in threads:
        t.join(HANG_GUARD_S)
    assert all(status == 200 for status, _, _ in rows), [r for r in rows if r[0] != 200]
    names = [tuple(p) for _, p, _ in rows]
    assert names[0] == ("category", "audience") and names[-1] == ("colour",)
    assert names == sorted(names, key=lambda n: n == ("colour",))  # the swap happens once, never back
    fingerprints = [fp for _, _, fp in rows]
    assert fingerprints[0] == before["fingerprint"] != fingerprints[-1]
    after = httpx.get(ops["url"] + "/v1/prompts", headers=AUTH, timeout=HANG_GUARD_S).json()
    assert [p["name"] for p in after["prompts"]] == ["colour"] and after["fingerprint"] == fingerprints[-1]
    assert after["reload"]["status"] == "serving" and after["reload"]["prompts"] == ["colour"]


def test_invalid_reloads_are_refused_and_the_old_configuration_keeps_serving(ops):
    from qcls.deployments.reload import RefusedReload
    from qcls.cli.reload import reload_main

    serving = classify(ops["url"], "blue jeans")["fingerprint"]
    with pytest.raises(ConfigError, match="prompts"):  # a typo: refused here, nothing is sent
        reload_main([*ops["overrides"], "prompts=no_such_prompt_set"])
    with pytest.raises(RefusedReload, match=r"changes model(.|\n)*deploy it anew"):  # other weights: a new deployment
        reload_main([*ops["overrides"], OTHER_WEIGHTS])
    keyless = [o for o in ops["overrides"] if not o.startswith("serve.api_key")]
    with pytest.raises(RefusedReload, match="changes serve"):  # dropping the key is a serving change, not a reload
        reload_main([*keyless, f"prompts={ops['colour']}"])
    with pytest.raises(RefusedReload, match="one token") as e:  # refused by the replica's build
        reload_main([*ops["overrides"], f"prompts={ops['clash']}"])
    assert serving in str(e.value)
    body = classify(ops["url"], "blue jeans")
    assert body["fingerprint"] == serving and [p["prompt"] for p in body["results"][0]["prompts"]] == ["colour"]
    state = httpx.get(ops["url"] + "/v1/prompts", headers=AUTH, timeout=HANG_GUARD_S).json()["reload"]
    assert state["status"] == "serving" and state["fingerprint"] == serving and "one token" in state["last_refusal"]


def test_serve_deploy_of_a_user_config_that_changes_the_weights_is_refused_in_the_replica(ops):
    """`serve deploy` with an edited user_config reaches reconfigure() directly: the replica refuses."""
    from ray import serve

    from qcls.deployments.app import app_for

    serving = classify(ops["url"], "green tee")["fingerprint"]
    cfg = compose([*ops["overrides"], f"prompts={ops['colour']}"])
    serve.run(app_for(cfg, ops["overrides"], user_config={"overrides": [OTHER_WEIGHTS]}), name=APP,
              route_prefix=f"/{APP}")
    state = until(lambda: (s := ops["handle"].reload_state.remote().result())["status"] == "refused" and s,
                  "the replica's refusal")
    assert "model" in state["detail"] and state["fingerprint"] == serving
    assert classify(ops["url"], "green tee")["fingerprint"] == serving
