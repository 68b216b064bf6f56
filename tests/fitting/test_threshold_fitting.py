"""Fitting abstention thresholds (qcls/fitting/threshold_fitting.py): out-of-fold probabilities from the folds that
chose the head's C, and `qcls calibrate --target-coverage / --target-precision / --thresholds-for` writing them
into the head file."""
from __future__ import annotations

import json

import numpy as np
import pytest

from qcls.fitting import heads as H
from qcls.fitting import nested
from qcls.fitting.head_fitting import StateSet
from qcls.sweep import models
from qcls.sweep.sweep import main as sweep_main
from qcls.fitting.calibrate import main
from qcls.fitting.threshold_fitting import head_probs, out_of_fold
from qcls.heads.files import load as load_head
from qcls.heads.head import Head, PromptHead, Read, Tap
from tests.fitting.test_calibrate import head_set, tiny


def test_out_of_fold_uses_the_folds_that_chose_C():
    """Held-out winners of the same stratified folds: their accuracy is cross_validate's at that C."""
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 12)
    states = (rng.normal(size=(36, 1, 5)) + y[:, None, None] * 0.7).astype(np.float32)
    taps = [Tap(2, "position")]
    x = H.features(states, taps, Read(2, "position"), None)
    C = 0.1
    cv = H.cross_validate(x, y, 3, [C], 3)
    ph = PromptHead(["a", "b", "c"], np.zeros(3), None, np.zeros((3, 5)), Read(2, "position"),
                    {"C": C, "cv_folds": 3})
    p = out_of_fold(ph, states, taps, np.zeros((36, 3)), y)
    assert p.shape == (36, 3) and np.allclose(p.sum(1), 1)
    assert np.mean(p.argmax(1) == y) == pytest.approx(cv[C]["accuracy"])
    assert np.mean(-np.log(p[np.arange(36), y])) == pytest.approx(cv[C]["log_loss"], rel=1e-9)  # the same optimum


def test_calibrate_writes_thresholds(tiny_dirs, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dev = head_set(tmp_path / "dev.jsonl")
    assert main(["--eval", str(dev), "--method", "head", "--layer", "1", "--read", "position",
                 "--target-coverage", "0.5", "--fallback", "none", "--out", "h.yaml", *tiny(tiny_dirs["qwen3"])]) == 0
    text = capsys.readouterr().out
    assert "thresholds (fitted on" in text and "coverage" in text
    head = load_head(tmp_path / "h.yaml")
    for name in ("category", "audience"):
        t = head.prompts[name].threshold
        assert t.fallback == "none" and t.fitted["target_coverage"] == 0.5 and t.fitted["coverage"] >= 0.5
        assert t.fitted["probabilities"] == "nested out-of-fold"
    # thresholds only, for the existing file, into another: its heads unchanged
    assert main(["--eval", str(dev), "--thresholds-for", "h.yaml", "--target-precision", "1.0",
                 "--target-precision", "audience=0.01", "--out", "t.yaml", "--json",
                 *tiny(tiny_dirs["qwen3"])]) == 0
    res = json.loads(capsys.readouterr().out)
    new = load_head(tmp_path / "t.yaml")
    assert np.array_equal(new.prompts["category"].bias, head.prompts["category"].bias)
    aud = res["thresholds"]["audience"]
    assert aud["reached"] and new.prompts["audience"].threshold.min_prob == aud["threshold"]
    assert aud["confidence"] == 0.9 and aud["lower_bound"] >= 0.01 and aud["answered"] <= aud["n"]
    assert new.prompts["audience"].threshold.fitted["lower_bound"] == round(aud["lower_bound"], 4)
    cat = res["thresholds"]["category"]  # no finite split certifies precision 1: said, and no threshold
    assert not cat["reached"] and new.prompts["category"].threshold is None and cat["best_lower_bound"] < 1.0
    assert main(["--eval", str(dev), "--thresholds-for", "h.yaml", "--target-precision", "1.0", "--out", "t.yaml",
                 *tiny(tiny_dirs["qwen3"])]) == 0
    text = capsys.readouterr().out
    assert "category: precision ≥ 1.0 NOT REACHED" in text and "lower bound" in text
    assert main(["--eval", str(dev), "--thresholds-for", "h.yaml", *tiny(tiny_dirs["qwen3"])]) == 2
    assert "give --target-precision or --target-coverage" in capsys.readouterr().err
    # a sweep job on another split with that file: the curve, and coverage / precision at its thresholds
    ev, out = head_set(tmp_path / "ev.jsonl", 20, offset=40), tmp_path / "run"
    assert sweep_main([*tiny(tiny_dirs["qwen3"]), f"eval.path={ev}", f"calibration={tmp_path / 'h.yaml'}",
                       "eval.batch1_queries=0", "eval.agreement_with_exact=false", f"hydra.run.dir={out}"]) == 0
    result = json.loads((out / "result.json").read_text())
    rows = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    for name in ("category", "audience"):
        b = result["coverage"]["per_prompt"][name]
        at, t = b["at_threshold"], head.prompts[name].threshold.min_prob
        cal = np.array([list(r["prompts"][name]["calibrated_probs"].values()) for r in rows])
        gold = np.array([list(r["prompts"][name]["probs"]).index(r["prompts"][name]["gold"]) for r in rows])
        answered = cal.max(1) >= t  # worked out here from the job's own predictions
        right = cal.argmax(1) == gold
        assert at["coverage"] == pytest.approx(answered.mean())
        assert at["precision"] == (pytest.approx(right[answered].mean()) if answered.any() else None)
        wrong = (~right).sum()
        assert at["errors_avoided"] == (pytest.approx(1 - (answered & ~right).sum() / wrong) if wrong else None)
        assert b["precision_at_coverage"]["1"] == pytest.approx(right.mean())
        assert ("tfidf" in at) == (at["answered"] > 0) and "tfidf_precision_at_coverage" in b
        assert all(r["prompts"][name]["abstained"] == (not a) for r, a in zip(rows, answered))
    summary = (out / "summary.md").read_text()
    assert "## Abstention: precision against coverage" in summary and (out / "precision_coverage.png").is_file()
    models.release()


def test_fold_counts_given_override_the_files_record():
    """`--thresholds-for FILE --nested-folds M`: the user's outer folds, not the ones the file records."""
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(2), 20)
    states = (rng.normal(size=(40, 1, 4)) + y[:, None, None]).astype(np.float32)
    taps, read = [Tap(2, "position")], Read(2, "position")
    ph = H.fit_prompt(states, taps, np.zeros((40, 2)), y, ["a", "b"], [read], False)
    sets = {"p": StateSet(["a", "b"], states, np.zeros((40, 2)), y)}
    head = Head({"p": ph}, "head", {})
    want = nested.run(sets, taps, nested.Search({"p": [read]}, False, 3, "best", None, 3, outer_folds=4)).probs["p"]
    assert np.allclose(head_probs(head, sets, taps, outer_folds=4)["p"][0], want)
    assert not np.allclose(head_probs(head, sets, taps)["p"][0], want)  # the file's own: 3 outer folds
