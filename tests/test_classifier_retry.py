"""`Classifier.classify` retries a batch whose forward raises query by query, the rule a server and `qcls bulk`
follow (qcls/results/requests.py): the query that makes the engine raise gets an internal error, the others their
answers, and a failure is never kept in the result cache."""
from __future__ import annotations

from qcls.classifier import Classifier
from qcls.results.requests import INTERNAL_ERROR, error_kind
from tests.conftest import prompt, tiny_cfg


def test_a_failing_batch_is_retried_query_by_query(tiny_dirs, monkeypatch):
    clf = Classifier(tiny_cfg(tiny_dirs["qwen3"], [prompt("p", ["a", "b"])], engine={"max_batch_size": 4}))
    real = clf._launch

    def poisoned(results, good):  # the engine raises on any batch that holds the poisoned query
        if any(results[i].query == "poison" for i, _, _ in good):
            raise RuntimeError("injected failure")
        return real(results, good)

    monkeypatch.setattr(clf, "_launch", poisoned)
    queries = ["mens jeans", "poison", "  ", "summer dress"]
    out = clf.classify(queries, cache=True)
    assert [r.query for r in out] == queries
    assert [error_kind(r) for r in out] == [None, INTERNAL_ERROR, "empty", None]
    assert "injected failure" in out[1].error
    monkeypatch.setattr(clf, "_launch", real)
    again = clf.classify(["poison", "mens jeans"], cache=True)
    assert again[0].ok and again[0].meta["cache"] == "miss"  # the failure was not kept
    assert again[1].meta["cache"] == "hit" and again[1].prompts == out[0].prompts
