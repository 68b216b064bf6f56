"""`qcls audit`: confident learning on out-of-fold probabilities (thresholds, each flagging rule, ranking, the
estimate), the probabilities averaged over several CV splittings, the second look (rows left out of the fitting,
thresholds over the trusted rows), the command's refusals before any model loads, and one run on a tiny
random-weight model."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from qcls.fitting import heads as H
from qcls.fitting.audit import COLUMNS, FILTERS, audit, confident_learning, main, label_thresholds
from qcls.fitting.head_fitting import StateSet
from qcls.fitting import nested
from qcls.fitting.threshold_fitting import head_probs, out_of_fold
from qcls.heads.head import Head, Read, Tap
from tests.eval.sweep_helpers import tiny, write_set

# two labels; rows 2 and 6 carry the other label than their probabilities say; row 3 is under both thresholds
PROBS = np.array([[0.9, 0.1], [0.7, 0.3], [0.2, 0.8], [0.55, 0.45], [0.1, 0.9], [0.35, 0.65], [0.7, 0.3]])
GIVEN = np.array([0, 0, 0, 0, 1, 1, 1])


def test_thresholds_are_the_mean_probability_of_each_label_over_the_rows_given_it():
    found = confident_learning(PROBS, GIVEN)
    assert found.thresholds == pytest.approx([(0.9 + 0.7 + 0.2 + 0.55) / 4, (0.9 + 0.65 + 0.3) / 3])


def test_rows_given_a_label_the_held_out_head_finds_unlikely_are_flagged_lowest_self_confidence_first():
    found = confident_learning(PROBS, GIVEN)
    # t = (0.5875, 0.617): row 2 (given 0) has p1 0.8 ≥ 0.617, row 6 (given 1) p0 0.7 ≥ 0.5875; row 3 is under both
    assert list(found.flagged) == [2, 6] and list(found.suggested) == [1, 0]
    assert found.joint.tolist() == [[2, 1], [1, 2]]  # row 3 is in no cell
    # calibrated: label 0 has 4 rows, 1 of the 3 counted off the diagonal; label 1 has 3 rows, 1 of 3
    assert found.estimate == pytest.approx(4 / 3 + 3 / 3)


def test_a_label_more_probable_than_the_one_over_its_threshold_is_not_flagged():
    """Row 1: given 0 at 0.5 (under its threshold 0.73), label 1 at 0.4 (at its own, 0.4): the joint counts it off
    the diagonal, but the given label is still the more probable, so the row is not flagged."""
    probs = np.array([[0.9, 0.1], [0.5, 0.4], [0.8, 0.2], [0.3, 0.7], [0.9, 0.1]])
    given = np.array([0, 0, 0, 1, 1])
    found = confident_learning(probs, given)
    assert found.joint[0, 1] == 1 and 1 not in found.flagged
    assert list(found.flagged) == [4] and list(found.suggested) == [0]


@pytest.mark.parametrize("rule", FILTERS)
def test_a_planted_wrong_label_is_found_and_a_clean_set_flags_few(rule):
    rng = np.random.default_rng(0)
    n, labels = 300, 5
    truth = np.arange(n) % labels
    logits = rng.normal(0, 1, (n, labels))
    logits[np.arange(n), truth] += 3.0  # a head right most of the time, never certain
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    clean = confident_learning(probs, truth, rule)
    assert len(clean.flagged) < 0.1 * n and clean.estimate < 0.1 * n
    given = truth.copy()
    planted = int(np.argmin(np.where(truth == 2, probs[:, 4], 1.0)))  # a 2 the head finds least likely a 4
    given[planted] = 4
    found = confident_learning(probs, given, rule)
    assert planted in found.flagged and found.suggested[list(found.flagged).index(planted)] == 2
    assert found.flagged[0] == planted  # its given label is the least likely of all


def test_the_rules_flag_the_rows_their_definitions_name():
    """Three labels; given 0: rows 0-3. Row 2 is counted off the diagonal of the confident joint (p1 0.8 over
    t1 0.75), row 3 is under every threshold but has the lowest p0; calibrated, cell (0, 1) holds 4 · 1/3 → 1 row."""
    probs = np.array([[0.9, 0.05, 0.05], [0.8, 0.1, 0.1], [0.15, 0.8, 0.05], [0.05, 0.3, 0.65],
                      [0.05, 0.9, 0.05], [0.3, 0.6, 0.1], [0.05, 0.05, 0.9], [0.1, 0.1, 0.8]])
    given = np.array([0, 0, 0, 0, 1, 1, 2, 2])
    got = {rule: confident_learning(probs, given, rule) for rule in FILTERS}
    assert got["confident_joint"].joint.tolist() == [[2, 1, 0], [0, 1, 0], [0, 0, 1]]
    assert all(f.estimate == pytest.approx(4 / 3) for f in got.values())
    assert list(got["confident_joint"].flagged) == [2] and list(got["confident_joint"].suggested) == [1]
    assert list(got["prune_by_noise_rate"].flagged) == [2]  # the largest margin p1 − p0 in cell (0, 1)
    assert list(got["prune_by_class"].flagged) == [3] and list(got["prune_by_class"].suggested) == [2]  # lowest p0
    assert len(got["both"].flagged) == 0


def test_probabilities_averaged_over_splittings_are_the_mean_of_each_splittings():
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 12)
    states = (rng.normal(size=(36, 1, 5)) + y[:, None, None] * 0.7).astype(np.float32)
    taps, read = [Tap(2, "position")], Read(2, "position")
    ph = H.fit_prompt(states, taps, np.zeros((36, 3)), y, ["a", "b", "c"], [read], False)
    sets = {"p": StateSet(["a", "b", "c"], states, np.zeros((36, 3)), y)}
    search = nested.Search({"p": [read]}, False, 3, "best", None, 3, outer_folds=3)  # as the file records
    each = [nested.run(sets, taps, search, seed).probs["p"] for seed in range(3)]
    one, three = (head_probs(Head({"p": ph}, "head", {}), sets, taps, r)["p"][0] for r in (1, 3))
    assert np.allclose(one, each[0]) and np.allclose(three, np.mean(each, axis=0))
    assert not np.allclose(each[0], each[1])  # the splittings differ


def test_a_row_left_out_is_scored_by_heads_never_fitted_on_it():
    """out_of_fold with leave_out: each fold's head is the one fitted on that fold's training rows less the rows
    left out, by hand; every row, left out or not, gets the probabilities of its own fold's head."""
    StratifiedKFold = H._sklearn()[0]
    rng = np.random.default_rng(1)
    y = np.repeat(np.arange(3), 12)
    states = (rng.normal(size=(36, 1, 5)) + y[:, None, None] * 0.7).astype(np.float32)
    taps, read = [Tap(2, "position")], Read(2, "position")
    ph = H.fit_prompt(states, taps, np.zeros((36, 3)), y, ["a", "b", "c"], [read], False)
    left = np.array([0, 13, 30])
    got = out_of_fold(ph, states, taps, np.zeros((36, 3)), y, 0, left)
    x, want = states[:, 0].astype(np.float64), np.zeros((36, 3))
    for tr, te in StratifiedKFold(n_splits=ph.info["cv_folds"], shuffle=True, random_state=0).split(x, y):
        f = H.fit_affine(x[[i for i in tr if i not in left]], y[[i for i in tr if i not in left]], 3, ph.info["C"])
        z = x[te] @ f.weights.T + f.bias
        want[te] = np.exp(z - z.max(1, keepdims=True)) / np.exp(z - z.max(1, keepdims=True)).sum(1, keepdims=True)
    assert np.allclose(got, want)
    assert not np.allclose(got, out_of_fold(ph, states, taps, np.zeros((36, 3)), y, 0))  # leaving out changes them


def test_a_fold_keeps_the_rows_of_a_label_it_would_otherwise_lose():
    """Every row of label 2 left out, and row 0: each fold's head is fitted as with row 0 alone left out, so label
    2's rows keep their probability instead of nearly none from a head that never saw the label."""
    rng = np.random.default_rng(1)
    y = np.repeat(np.arange(3), 12)
    states = (rng.normal(size=(36, 1, 5)) + y[:, None, None] * 0.7).astype(np.float32)
    taps, read = [Tap(2, "position")], Read(2, "position")
    ph = H.fit_prompt(states, taps, np.zeros((36, 3)), y, ["a", "b", "c"], [read], False)
    got = out_of_fold(ph, states, taps, np.zeros((36, 3)), y, 0, np.r_[0, np.flatnonzero(y == 2)])
    assert np.allclose(got, out_of_fold(ph, states, taps, np.zeros((36, 3)), y, 0, np.array([0])))
    assert got[y == 2, 2].mean() > 0.3


def test_the_second_look_takes_thresholds_over_the_rows_the_first_trusts():
    # rows 2 and 6 flagged by the first look: label 0's threshold over rows 0, 1, 3; label 1's over rows 4, 5
    assert label_thresholds(PROBS, GIVEN, np.array([2, 6])) == pytest.approx([(0.9 + 0.7 + 0.55) / 3,
                                                                              (0.9 + 0.65) / 2])
    # a label none of whose rows is trusted keeps the mean over all of them; a label nobody gave never counts
    assert label_thresholds(PROBS, GIVEN, np.array([4, 5, 6]))[1] == pytest.approx((0.9 + 0.65 + 0.3) / 3)
    assert label_thresholds(np.hstack([PROBS, np.zeros((7, 1))]), GIVEN, np.array([2]))[2] == np.inf


def test_two_passes_judge_the_second_looks_probabilities_against_the_label_thresholds():
    """audit(…, 2): the first look's flags are left out of the second's fitting, and the second look's
    probabilities are judged against the first look's means over the rows it trusts; audit(…, 1) is one look."""
    rng = np.random.default_rng(6)
    y = np.repeat(np.arange(3), 12)
    states = (rng.normal(size=(36, 1, 5)) + y[:, None, None] * 2.5).astype(np.float32)
    given = y.copy()
    given[[0, 12]] = [2, 0]  # two labels changed
    taps, read = [Tap(2, "position")], Read(2, "position")
    ph = H.fit_prompt(states, taps, np.zeros((36, 3)), given, ["a", "b", "c"], [read], False)
    head, sets = Head({"p": ph}, "head", {}), {"p": StateSet(["a", "b", "c"], states, np.zeros((36, 3)), given)}
    first = head_probs(head, sets, taps, 2)["p"][0]
    one = confident_learning(first, given)
    assert {0, 12} <= set(one.flagged)
    found, probs, got_given, _ = audit(head, sets, taps, 2, 2)["p"]
    second = head_probs(head, sets, taps, 2, leave_out={"p": one.flagged})["p"][0]
    want = confident_learning(second, given, thresholds=label_thresholds(first, given, one.flagged))
    assert np.allclose(probs, second) and list(found.flagged) == list(want.flagged) and list(got_given) == list(given)
    assert np.allclose(found.thresholds, label_thresholds(first, given, one.flagged))
    assert {0, 12} <= set(found.flagged)
    one_pass = audit(head, sets, taps, 2, 1)["p"]
    assert np.allclose(one_pass[1], first) and list(one_pass[0].flagged) == list(one.flagged)
    with pytest.raises(ValueError, match="1 or 2"):
        audit(head, sets, taps, 2, 3)


# ---- the command ----------------------------------------------------------------------------------------------
def test_a_predictions_file_is_refused_with_the_way_out(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    table = tmp_path / "answers.csv"
    table.write_text("query,pred:category,pred:category:prob,pred:category:abstained\nred dress,dress,0.9,false\n")
    lines = tmp_path / "log.jsonl"
    lines.write_text(json.dumps({"query": "red dress", "pred:category": "dress", "pred:category:prob": 0.9}) + "\n")
    for path in (table, lines):
        assert main([str(path), "prompts=default"]) == 2
        err = capsys.readouterr().err
        assert str(path) in err and "predictions file" in err and "qcls label-next" in err
    from qcls.fitting.calibrate import main as calibrate_main  # the reader's refusal holds for calibrate too
    assert calibrate_main(["--eval", str(table), "prompts=default"]) == 2
    assert "predictions file" in capsys.readouterr().err
    assert not (tmp_path / "audit.csv").exists()


@pytest.mark.parametrize("rows, says", [
    ([("red dress", {"category": "frock"})], "'frock' for prompt 'category' is not one of its labels"),
    ([("red dress", {"category": "dress"}), ("red dress", {"category": "skirt"})], "duplicate query 'red dress'"),
])
def test_unknown_labels_and_duplicate_queries_are_refused(rows, says, tmp_path, capsys):
    path = write_set(tmp_path / "labels.jsonl", rows)
    assert main([str(path), "prompts=default", "--out", str(tmp_path / "a.csv")]) == 2
    err = capsys.readouterr().err
    assert says in err and f"{path}:{len(rows)}:" in err and not (tmp_path / "a.csv").exists()


def test_an_output_nobody_named_is_not_overwritten(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    labels = tmp_path / "labels.csv"
    labels.write_text("query,category\nred dress,dress\n")
    (tmp_path / "audit.csv").write_text("an earlier audit\n")
    assert main([str(labels), "prompts=default"]) == 2
    err = capsys.readouterr().err
    assert "audit.csv exists" in err and "--out audit.csv" in err
    assert (tmp_path / "audit.csv").read_text() == "an earlier audit\n"
    assert main([str(labels), "prompts=default", "--out", str(labels)]) == 2  # the labels themselves
    assert "is the labelled file" in capsys.readouterr().err and labels.read_text().startswith("query,category")
    assert main(["no_such.csv", "prompts=default"]) == 2
    assert "no_such.csv: no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["prompts=default"])  # no labelled file


def test_fewer_than_one_splitting_is_refused(tmp_path, capsys):
    labels = tmp_path / "labels.csv"
    labels.write_text("query,category\nred dress,dress\n")
    assert main([str(labels), "prompts=default", "--cv-splittings", "0", "--out", str(tmp_path / "a.csv")]) == 2
    assert "--cv-splittings 0" in capsys.readouterr().err and not (tmp_path / "a.csv").exists()


def test_audit_on_a_tiny_model_flags_the_planted_label(tiny_dirs, tmp_path, capsys, monkeypatch):
    """Ten labels, six queries each that name their label; one query naming `dress` is labelled `jeans`."""
    monkeypatch.chdir(tmp_path)
    cats = ["dress", "jeans", "shirt", "trench", "skirt", "tee", "hoodie", "knit", "other", "none"]
    rows = [(f"{c} {w} {c}", {"category": c}) for c in cats for w in ["red", "blue", "slim", "cotton", "kids", "wool"]]
    path = write_set(tmp_path / "labels.jsonl", rows + [("dress long dress", {"category": "jeans"})])
    argv = [str(path), *tiny(tiny_dirs["qwen3"]), "--layer", "1", "--read", "query_mean", "--json"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    with open(tmp_path / "audit.csv", encoding="utf-8", newline="") as f:
        got = list(csv.DictReader(f))
    assert tuple(got[0]) == COLUMNS and [json.loads(x) for x in out.splitlines()] == [
        {**r, "given_prob": float(r["given_prob"]), "suggested_prob": float(r["suggested_prob"]),
         "rank": int(r["rank"])} for r in got]
    assert [r["rank"] for r in got] == [str(i) for i in range(1, len(got) + 1)]
    assert all(r["suggested"] != r["given"] and float(r["given_prob"]) < float(r["suggested_prob"]) for r in got)
    assert got[0]["query"] == "dress long dress" and (got[0]["given"], got[0]["suggested"]) == ("jeans", "dress")
    assert "category  61" in err and "estimated wrong" in err and "'audience' has no labelled query" in err
    assert "2 passes" in err
    assert main(argv) == 2 and "audit.csv exists" in capsys.readouterr().err  # a second run does not overwrite it
    assert main(argv + ["--passes", "1", "--out", "one.csv", "calibration=their_head.yaml"]) == 0
    err = capsys.readouterr().err
    assert "1 pass)" in err and "calibration=their_head.yaml is not read" in err  # a head given is not silently used
    with open(tmp_path / "one.csv", encoding="utf-8", newline="") as f:
        assert next(csv.DictReader(f))["query"] == "dress long dress"
    with pytest.raises(SystemExit):
        main(argv + ["--passes", "3", "--out", "three.csv"])
    assert "invalid choice" in capsys.readouterr().err and not (tmp_path / "three.csv").exists()


@pytest.mark.parametrize("layer", ["99", "0", "seven"])
def test_a_layer_the_model_lacks_is_refused_before_it_loads(layer, tiny_dirs, tmp_path, capsys, monkeypatch):
    """The depth comes from the model's config: `--layer` beyond it is refused before a weight is read, for
    `qcls audit` and `qcls calibrate --method head` alike (they share the head options)."""
    from qcls.classifier import Classifier
    from qcls.fitting.calibrate import main as calibrate_main

    def loads(*args, **kwargs):
        raise AssertionError("the model was loaded before the layer was checked")
    monkeypatch.setattr(Classifier, "__init__", loads)
    monkeypatch.chdir(tmp_path)
    cats = ["dress", "jeans", "shirt", "trench", "skirt", "tee", "hoodie", "knit", "other", "none"]
    path = write_set(tmp_path / "labels.jsonl", [(f"{c} {w}", {"category": c}) for c in cats for w in "abc"])
    over = [*tiny(tiny_dirs["qwen3"]), "--layer", layer]
    assert main([str(path), *over]) == 2
    err = capsys.readouterr().err
    assert f"--layer {layer}: this model has" in err and "--layer auto" in err and not (tmp_path / "audit.csv").exists()
    assert calibrate_main(["--method", "head", "--eval", str(path), *over, "--out", str(tmp_path / "h.yaml")]) == 2
    assert f"--layer {layer}: this model has" in capsys.readouterr().err and not (tmp_path / "h.yaml").exists()
