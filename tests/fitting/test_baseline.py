"""The TF-IDF + logistic regression and majority baselines (qcls/fitting/baseline.py), recomputed by hand: the
features of three tiny strings from the TF-IDF formula, and accuracy / macro-F1 / majority on a toy set whose
predictions are forced; plus the sweep report's per-prompt baseline section."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from qcls.config import PromptSpec
from qcls.fitting import baseline
from qcls.sweep import report
from qcls.eval.dataset import EvalSet, Example
from qcls.fitting.heads import CS
from tests.conftest import prompt


def test_tfidf_features_by_hand():
    """char_wb n-grams (1-3) of each word padded with one space; tf → 1 + ln tf; idf = ln((1+n)/(1+df)) + 1;
    rows of unit L2 norm."""
    docs = ["ab", "B", "ba"]  # lowercased: "B" → "b"
    counts = [{" ": 2, "a": 1, "b": 1, " a": 1, "ab": 1, "b ": 1, " ab": 1, "ab ": 1},  # " ab "
              {" ": 2, "b": 1, " b": 1, "b ": 1, " b ": 1},  # " b "
              {" ": 2, "b": 1, "a": 1, " b": 1, "ba": 1, "a ": 1, " ba": 1, "ba ": 1}]  # " ba "
    grams = sorted({g for c in counts for g in c})
    df = {g: sum(g in c for c in counts) for g in grams}
    want = []
    for c in counts:
        v = np.array([(1 + math.log(c[g])) * (math.log(4 / (1 + df[g])) + 1) if g in c else 0.0 for g in grams])
        want.append(v / math.sqrt((v ** 2).sum()))
    vec = baseline.vectorizer().fit(docs)
    assert sorted(vec.vocabulary_) == grams
    got = vec.transform(docs).toarray()[:, [vec.vocabulary_[g] for g in grams]]
    np.testing.assert_allclose(got, np.array(want), atol=1e-12)


SPEC = PromptSpec(**prompt("category", ["dress", "jeans", "none", "skirt"]))
FIT = [("red dress", "dress"), ("summer dress", "dress"), ("long dress", "dress"), ("dress women", "dress"),
       ("blue jeans", "jeans"), ("slim jeans", "jeans"), ("jeans men", "jeans"),
       ("gift ideas", "none"), ("gift card", "none"), ("ideas gift", "none")]


def eval_set(rows) -> EvalSet:
    return EvalSet("toy.jsonl", [Example(q, {"category": g}, i + 1) for i, (q, g) in enumerate(rows)])


def test_accuracy_macro_f1_and_majority_by_hand():
    """Scored queries are fitting queries (whose winners the fitted model cannot miss), one of them with
    another gold label: winners [dress, jeans, jeans, none] against gold [dress, dress, jeans, none]."""
    scored = [("red dress", "dress"), ("blue jeans", "dress"), ("slim jeans", "jeans"), ("gift card", "none")]
    b = baseline.block([SPEC], eval_set(scored), eval_set(FIT))
    v = b["per_prompt"]["category"]
    assert (v["n"], v["n_fit"], v["scored"], v["majority_label"]) == (4, 10, "held out", "dress")
    assert v["C"] in CS
    assert v["accuracy"] == pytest.approx(3 / 4)
    # F1: dress tp 1 fn 1 → 2/3; jeans tp 1 fp 1 → 2/3; none 1; skirt never gold nor predicted: left out
    assert v["macro_f1"] == pytest.approx((2 / 3 + 2 / 3 + 1) / 3)
    # always "dress" (the fitting split's most frequent label): 2 of 4; F1 dress 2·2/(2·2+2) = 2/3, jeans 0, none 0
    assert v["majority_accuracy"] == pytest.approx(2 / 4)
    assert v["majority_macro_f1"] == pytest.approx((2 / 3) / 3)
    assert b["mean"]["accuracy"] == pytest.approx(3 / 4) and "fitted on toy.jsonl" in b["source"]
    cv = baseline.block([SPEC], eval_set(FIT), None, folds=3)["per_prompt"]["category"]
    assert cv["scored"] == "cross-validated" and cv["n"] == 10 and cv["accuracy"] == cv["cv_accuracy"]


def test_a_prompt_without_fitting_labels_is_recorded_not_fatal():
    other = PromptSpec(**prompt("audience", ["man", "woman"]))
    b = baseline.block([SPEC, other], eval_set([("red dress", "dress")]), eval_set(FIT))
    assert b["per_prompt"]["audience"]["error"] == "no labelled query in the fitting split"
    assert "error" not in b["per_prompt"]["category"]
    lines = baseline.table(b, {"category": 0.5}, "head")
    assert any(x.split()[:1] == ["audience"] and "no labelled query" in x for x in lines)


def test_report_section_names_the_winner_per_prompt(tmp_path):
    base = {"method": baseline.METHOD, "source": "fitted on dev, scored on test", "folds": 3,
            "per_prompt": {"category": {"n": 10, "accuracy": 0.7, "macro_f1": 0.6, "majority_accuracy": 0.2},
                           "audience": {"n": 10, "accuracy": 0.8, "macro_f1": 0.5, "majority_accuracy": 0.5}},
            "mean": {"accuracy": 0.75, "macro_f1": 0.55, "majority_accuracy": 0.35}}
    for job, (cat, aud, cal_cat) in enumerate([(0.5, 0.9, 0.75), (0.6, 0.6, None)]):
        d = tmp_path / str(job)
        d.mkdir()
        result = {"status": "ok", "overrides": [f"scoring={'trie' if job == 0 else 'exact'}"],
                  "per_prompt": {"category": {"accuracy": cat}, "audience": {"accuracy": aud}},
                  "mean": {"accuracy": (cat + aud) / 2}, "baseline": base}
        if cal_cat is not None:
            result["calibration"] = {"per_prompt": {"category": {"calibrated": {"accuracy": cal_cat}},
                                                    "audience": {"calibrated": {"accuracy": 0.85}}}}
        (d / "result.json").write_text(json.dumps(result), encoding="utf-8")
    report.build([tmp_path])
    md = (tmp_path / "summary.md").read_text(encoding="utf-8")
    assert "## Baselines per prompt (fitted on dev, scored on test)" in md
    assert "| category | 10 | 0.200 | 0.700 [0.397, 0.892] | 0.600 | 0.600 [0.313, 0.832] (1) | 0.750 (0) | LLM |" in md
    assert "| audience | 10 | 0.500 | 0.800 [0.490, 0.943] | 0.500 | 0.900 [0.596, 0.982] (0) | 0.850 (0) | LLM |" in md
    assert any(x.startswith("| job |") and "| majority acc | TF-IDF acc | TF-IDF F1 |" in x for x in md.splitlines())
    base["per_prompt"]["audience"]["accuracy"] = 0.95
    (tmp_path / "0" / "result.json").write_text(json.dumps({**json.loads((tmp_path / "0" / "result.json")
                                                                          .read_text()), "baseline": base}))
    (tmp_path / "1" / "result.json").write_text(json.dumps({**json.loads((tmp_path / "1" / "result.json")
                                                                          .read_text()), "baseline": base}))
    report.build([tmp_path])
    assert "| audience | 10 | 0.500 | 0.950 | 0.500 | 0.900 [0.596, 0.982] (0) | 0.850 (0) | TF-IDF |" in \
        (tmp_path / "summary.md").read_text(encoding="utf-8")
