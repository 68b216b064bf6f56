"""The request path's first and last steps (qcls/results/requests.py), the same for Classifier.classify and a
serving replica: refusals by the one rule, answers from the result cache, the rest left to forwards and kept."""
from __future__ import annotations

from qcls.results import LabelScore, PromptResult, QueryResult
from qcls.results.cache import ResultCache
from qcls.results.requests import INTERNAL_ERROR, Request, error_kind, failed
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
    assert (error_kind(bad), error_kind(empty)) == ("not_text", "empty") and "empty query" in empty.error
    out = req.close([answer("new"), answer("new")])
    assert [r.query for r in out] == ["seen", 3, "new", "  ", "new"] and out[2].meta["cache"] == "miss"
    assert Request.open(["new"], enc, cache, "f").hits == 1  # kept
    assert Request.open(["new"], enc, cache, "another configuration").hits == 0
    assert Request.open(["seen"], enc, None, "f").todo == ["seen"]  # no cache asked for


def test_one_error_kind_for_a_result_and_for_the_message_a_part_file_keeps():
    enc = QueryEncoder(ByteTokenizer(), 8)
    refusals = [Request.open([q], enc, None, "f").results[0] for q in ("  ", "x" * 9, 3)]
    assert [error_kind(r) for r in refusals] == ["empty", "too_long", "not_text"]
    assert [error_kind(r.error) for r in refusals] == ["empty", "too_long", "not_text"]  # the text alone
    assert [r.meta["error_kind"] for r in refusals] == ["empty", "too_long", "not_text"]
    rows = ["undecodable bytes: the line (line 3) is not valid UTF-8", "malformed: line 2 is not JSON (x)",
            "missing: no value in column 'query'", "not text: column 'query' holds a int"]
    assert [error_kind(e) for e in rows] == ["undecodable", "malformed", "missing", "not_text"]
    internal = failed("q", "engine unusable: probe failed")
    assert error_kind(internal) == error_kind(internal.error) == INTERNAL_ERROR
    assert error_kind(failed("q", "a message no rule knows")) == INTERNAL_ERROR  # failed is internal whatever it says
    assert error_kind(answer("ok")) is None and error_kind("something else") == "other"
