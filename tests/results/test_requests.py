"""The request path's first and last steps (qcls/results/requests.py), the same for Classifier.classify and a
serving replica: refusals by the one rule, answers from the result cache, the rest left to forwards and kept."""
from __future__ import annotations

from qcls.results import LabelScore, PromptResult, QueryResult
from qcls.results.cache import ResultCache
from qcls.results.requests import QUERY_ERROR, Request, error_kind
from qcls.scoring.tokenization import QueryEncoder, refusal


class ByteTokenizer:
    def encode(self, text, add_special_tokens=False):
        return list(text.encode())


def answer(query: str) -> QueryResult:
    return QueryResult(query, [PromptResult("p", "a", 1.0, [LabelScore("a", 0.0, 1.0, 1)])], None, len(query), 1,
                       {"total": 1.0}, {"fingerprint": "f"})


def test_refusals_name_the_problem():
    enc = QueryEncoder(ByteTokenizer(), 8)
    assert refusal(enc, "ok") is None
    assert "empty query" in refusal(enc, "  ")
    assert "max_query_tokens=8" in refusal(enc, "x" * 9)
    assert refusal(enc, 3) == "a query must be a string, got int"


def test_a_request_refuses_answers_from_the_cache_and_leaves_the_rest_to_forwards():
    enc, cache = QueryEncoder(ByteTokenizer(), 8), ResultCache(10)
    assert cache.remember("f", [answer("seen")]) == 0
    req = Request.open(["seen", 3, "new", "  ", "new"], enc, cache, "f")
    assert req.todo == ["new", "new"] and req.hits == 1
    hit, bad, _, empty, _ = req.results
    assert hit.meta["cache"] == "hit" and hit.batch_size == 0 and "cache" in hit.timings_ms
    assert error_kind(bad) == error_kind(empty) == QUERY_ERROR and "empty query" in empty.error
    out = req.close([answer("new"), answer("new")])
    assert [r.query for r in out] == ["seen", 3, "new", "  ", "new"] and out[2].meta["cache"] == "miss"
    assert Request.open(["new"], enc, cache, "f").hits == 1  # kept
    assert Request.open(["new"], enc, cache, "another configuration").hits == 0
    assert Request.open(["seen"], enc, None, "f").todo == ["seen"]  # no cache asked for
