"""Comparisons between served results (HTTP dicts or handle dataclasses) and `Classifier.classify`."""
from __future__ import annotations

from dataclasses import asdict

import pytest

from qcls.results import QueryResult

# Replica and test process differ in thread count (reduction order) and a batch in bucket shape.
TOL = dict(rel=1e-4, abs=1e-4)


def as_dict(r) -> dict:
    return asdict(r) if isinstance(r, QueryResult) else r


def assert_same(served, local: QueryResult) -> None:
    s, ref = as_dict(served), asdict(local)
    assert s["query"] == ref["query"]
    assert s["error"] == ref["error"]
    assert s["query_tokens"] == ref["query_tokens"]
    assert [p["prompt"] for p in s["prompts"]] == [p["prompt"] for p in ref["prompts"]]
    for sp, rp in zip(s["prompts"], ref["prompts"]):
        assert sp["label"] == rp["label"], (s["query"], sp["prompt"])
        assert sp["prob"] == pytest.approx(rp["prob"], **TOL)
        assert [lab["label"] for lab in sp["labels"]] == [lab["label"] for lab in rp["labels"]]
        assert [lab["score"] for lab in sp["labels"]] == pytest.approx([lab["score"] for lab in rp["labels"]], **TOL)
        assert [lab["prob"] for lab in sp["labels"]] == pytest.approx([lab["prob"] for lab in rp["labels"]], **TOL)
        assert [lab["tokens"] for lab in sp["labels"]] == [lab["tokens"] for lab in rp["labels"]]


def assert_no_trace(text: str) -> None:
    assert "Traceback" not in text and 'File "' not in text, text
