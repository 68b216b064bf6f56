"""Every bad request gets a 4xx naming the problem (and the limit), never a stack trace, and the replica
keeps serving: each case is followed by a good request."""
from __future__ import annotations

import json

import pytest

from tests.deployments.helpers import assert_no_trace

pytestmark = pytest.mark.slow

GOOD = {"query": "maxi dress"}
LONG = "red cotton hoodie " * 10  # well over max_query_tokens=16

CASES = [  # id, body (dict → JSON, bytes → as is), status, words the message must contain
    ("empty", {"query": ""}, 422, ["empty query"]),
    ("whitespace", {"query": " \t\n "}, 422, ["empty query"]),
    ("too_long", {"query": LONG}, 422, ["max_query_tokens=16"]),
    ("too_many", {"queries": ["maxi dress"] * 17}, 422, ["17 queries", "max_queries_per_request=16"]),
    ("no_queries", {"queries": []}, 422, ['"queries" is empty']),
    ("neither", {}, 422, ['exactly one of "query"']),
    ("both", {"query": "a", "queries": ["b"]}, 422, ['exactly one of "query"']),
    ("query_int", {"query": 12}, 422, ["query", "valid string"]),
    ("queries_str", {"queries": "maxi dress"}, 422, ["queries", "valid array"]),
    ("queries_items", {"queries": ["ok", 3, None]}, 422, ["queries.1", "queries.2", "valid string"]),
    ("top_array", ["maxi dress"], 422, ["object"]),
    ("null", None, 422, ["object"]),
    ("unknown_field", {"query": "a", "top_k": 3}, 422, ["top_k", "unknown field"]),
    ("malformed", b'{"query": "maxi', 400, ["malformed JSON"]),
    ("not_json", b"query=maxi+dress", 400, ["malformed JSON"]),
    ("empty_body", b"", 400, ["malformed JSON"]),
    ("lone_surrogate", b'{"query": "\\ud800"}', 400, ["malformed JSON"]),
    ("all_refused", {"queries": ["", LONG]}, 422, ["no query could be classified", "queries[0]",
                                                   "max_query_tokens=16"]),
]


def _post(http, body, **kw):
    if isinstance(body, bytes):
        return http.post("/v1/classify", content=body, headers={"content-type": "application/json"}, **kw)
    return http.post("/v1/classify", content=json.dumps(body), headers={"content-type": "application/json"}, **kw)


def _still_serves(http):
    r = http.post("/v1/classify", json=GOOD)
    assert r.status_code == 200 and r.json()["results"][0]["ok"], r.text


@pytest.mark.parametrize("body,status,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_request_is_a_4xx_that_names_the_problem(http, body, status, words):
    r = _post(http, body)
    assert r.status_code == status, r.text
    assert_no_trace(r.text)
    detail = r.json()["detail"]
    for w in words:
        assert w in detail, (w, detail)
    _still_serves(http)


def test_ten_megabyte_body_is_refused_before_parsing(http):
    r = http.post("/v1/classify", content=b"x" * (10 << 20), headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    assert "max_body_bytes=1048576" in r.json()["detail"]
    assert_no_trace(r.text)
    _still_serves(http)


def test_chunked_body_without_length_is_counted(http):
    def chunks():
        for _ in range(40):
            yield b" " * 65536  # 2.5 MiB of whitespace, no Content-Length

    r = http.post("/v1/classify", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    assert "max_body_bytes=1048576" in r.json()["detail"]
    _still_serves(http)


def test_some_refused_queries_fail_alone_with_200(http):
    r = http.post("/v1/classify", json={"queries": ["maxi dress", "  ", LONG, "boys tee"]})
    assert r.status_code == 200, r.text
    res = r.json()["results"]
    assert [x["ok"] for x in res] == [True, False, False, True]
    assert "empty query" in res[1]["error"] and res[1]["prompts"] == []
    assert "max_query_tokens=16" in res[2]["error"]
    assert res[0]["prompts"] and res[3]["prompts"]


def test_handle_refuses_like_http(handle):
    good, empty, surrogate = handle.classify.remote(["maxi dress", "", "\ud800"]).result()
    assert good.ok and good.prompts
    assert not empty.ok and "empty query" in empty.error
    assert not surrogate.ok and "cannot be tokenized" in surrogate.error
    with pytest.raises(ValueError, match="max_queries_per_request=16"):
        handle.classify.remote(["maxi dress"] * 17).result()
    with pytest.raises(TypeError, match="list of query strings"):
        handle.classify.remote("maxi dress").result()
    assert handle.classify.remote(["maxi dress"]).result()[0].ok
