"""The orjson response bodies equal what the pydantic models write, and validate against them."""
from __future__ import annotations

import json
import math

import pytest

from qcls.deployments.encode import classify_body
from qcls.deployments.schemas import ClassifyResponse, CompactClassifyResponse, QueryOut
from qcls.results import LabelScore, PromptResult, QueryResult


def result(calibrated: bool = False, nan: bool = False) -> QueryResult:
    labels = [LabelScore("dress", float("nan") if nan else -0.5, 0.6, 1), LabelScore("jeans", -1.5, 0.4, 2)]
    extra = {}
    if calibrated:
        for lab, (hs, hp) in zip(labels, ((-0.2, 0.7), (-1.1, 0.3))):
            lab.raw_prob, lab.head_score, lab.prob = lab.prob, hs, hp
        extra = {"raw_label": "dress", "raw_prob": 0.6}
    p = PromptResult("category", "dress", 0.7 if calibrated else 0.6, labels, **extra)
    return QueryResult("maxi dress", [p], None, 3, 2, {"forward": 1.5, "total": 2.0, "queue_wait": 0.1},
                       {"engine": "fast", "tokens_per_forward": 20})


@pytest.mark.parametrize("calibrated", [False, True])
def test_full_body_equals_the_pydantic_models(calibrated):
    rs = [result(calibrated), QueryResult("", error="empty query", meta={"error_kind": "query"})]
    fast = json.loads(classify_body("demo", rs))
    slow = json.loads(ClassifyResponse(model="demo", results=[QueryOut.of(r) for r in rs]).model_dump_json())
    assert fast == slow
    ClassifyResponse.model_validate(fast)
    lab = fast["results"][0]["prompts"][0]["labels"][0]
    assert (lab["prob"], lab["raw_prob"]) == ((0.7, 0.6) if calibrated else (0.6, None))


def test_nan_scores_are_written_as_null_like_pydantic():
    body = json.loads(classify_body("demo", [result(nan=True)]))
    assert body["results"][0]["prompts"][0]["labels"][0]["score"] is None
    assert not math.isnan(body["results"][0]["prompts"][0]["labels"][1]["score"])


@pytest.mark.parametrize("calibrated", [False, True])
def test_compact_body_has_winners_only(calibrated):
    body = json.loads(classify_body("demo", [result(calibrated)], compact=True))
    CompactClassifyResponse.model_validate(body)
    [p] = body["results"][0]["prompts"]
    assert p["label"] == "dress" and "labels" not in p and "meta" not in body["results"][0]
    assert ("raw_label" in p) == calibrated
    assert len(classify_body("demo", [result()], compact=True)) < len(classify_body("demo", [result()])) / 2


@pytest.mark.parametrize("compact", [False, True])
def test_an_abstained_prompt_validates_with_a_null_label(compact):
    r = result(calibrated=True)
    r.prompts[0].label, r.prompts[0].abstained = None, True
    body = json.loads(classify_body("demo", [r], compact=compact))
    (CompactClassifyResponse if compact else ClassifyResponse).model_validate(body)
    p = body["results"][0]["prompts"][0]
    assert p["label"] is None and p["abstained"] is True and p["prob"] == 0.7
    if not compact:
        assert body == json.loads(ClassifyResponse(model="demo", results=[QueryOut.of(r)]).model_dump_json())
        assert [lab["prob"] for lab in p["labels"]] == [0.7, 0.3]  # every label's probability kept
