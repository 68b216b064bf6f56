"""Nested cross-validation of a head fit (qcls/fitting/nested.py): on labels that no state predicts, the search's
own cross-validated accuracy flatters the read it picks and the nested one does not; the search a head file
records is the one run again."""
from __future__ import annotations

import numpy as np

from qcls.fitting import head_depth, nested
from qcls.fitting import heads as H
from qcls.fitting.head_fitting import StateSet
from qcls.heads.head import FINAL, Head, PromptHead, Read, Tap

LAYERS = range(1, 13)


def noise_set(seed: int) -> tuple[StateSet, list[Tap], list[Read]]:
    """60 queries, two balanced labels, 12 candidate reads of pure noise: every read is as good as a coin."""
    rng = np.random.default_rng(seed)
    taps = [Tap(lay, "position") for lay in LAYERS]
    gold = np.repeat([0, 1], 30)
    states = rng.normal(size=(60, len(taps), 4)).astype(np.float32)
    return StateSet(["a", "b"], states, np.zeros((60, 2)), gold), taps, [Read(lay, "position") for lay in LAYERS]


def test_nested_accuracy_does_not_flatter_the_winner_of_a_search():
    chosen, nest = [], []
    for seed in range(4):
        ss, taps, reads = noise_set(seed)
        tried = H.cv_reads(ss.states, taps, ss.scores, ss.gold, 2, reads, False)
        chosen.append(head_depth.choose({"p": tried}, 13, "best").reads["p"].accuracy)
        got = nested.run({"p": ss}, taps, nested.Search({"p": reads}, False, 3, "best", None, 13))
        assert got.probs["p"].shape == (60, 2) and np.allclose(got.probs["p"].sum(1), 1)
        nest.append(got.accuracy("p"))
    assert np.mean(chosen) > 0.58  # the best of 12 coins, judged on the folds that picked it
    assert abs(np.mean(nest) - 0.5) < 0.08 and np.mean(chosen) - np.mean(nest) > 0.08


def test_each_outer_fold_repeats_the_search_without_its_rows():
    """By hand: each of the 5 outer folds' rows is scored by the head whose read and C a 3-fold search chose on
    the other rows."""
    ss, taps, reads = noise_set(0)
    ss.states[:, 3] += ss.gold[:, None] * 1.5  # layer 4 carries the label
    got = nested.run({"p": ss}, taps, nested.Search({"p": reads}, False, 3, "best", None, 13, outer_folds=5), seed=1)
    assert len(got.exits) == 5
    want = np.zeros((60, 2))
    for tr, te in H._sklearn()[0](n_splits=5, shuffle=True, random_state=1).split(np.zeros(60), ss.gold):
        tried = H.cv_reads(ss.states[tr], taps, None, ss.gold[tr], 2, reads, False, folds=3, seed=1)
        best = head_depth.most_accurate(tried)
        x = H.features(ss.states, taps, best.read, None)
        f = H.fit_affine(x[tr], ss.gold[tr], 2, best.C)
        z = x[te] @ f.weights.T + f.bias
        want[te] = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    assert np.allclose(got.probs["p"], want)
    assert got.accuracy("p") > 0.8


def test_search_of_a_head_file():
    ph = PromptHead(["a", "b"], np.zeros(2), None, np.zeros((2, 4)), Read(4, "position"),
                    {"C": 1.0, "cv_folds": 4, "reads_tried": {"position@4": {}, "query_mean@2": {}, "position@final": {}}})
    one = PromptHead(["a", "b"], np.zeros(2), None, np.zeros((2, 4)), Read(3, "both"), {"C": 1.0, "cv_folds": 4})
    s = nested.search_of(Head({"p": ph, "q": one}, "head", {"num_layers": 18, "depth": {"rule": "one-se",
                                                                                           "max_layer": 12}}))
    assert s.reads == {"p": [Read(4, "position"), Read(2, "query_mean"), Read(FINAL, "position")],
                       "q": [Read(3, "both")]}
    assert (s.folds, s.rule, s.max_layer, s.num_layers, s.with_scores) == (4, "one-se", 12, 18, False)
    assert s.outer_folds == 4  # a file without nested_folds was judged with the search's folds
    ph.info["nested_folds"] = one.info["nested_folds"] = 6
    assert nested.search_of(Head({"p": ph, "q": one}, "head", {"num_layers": 18})).outer_folds == 6


def test_outer_folds_are_capped_where_no_label_has_a_row_for_each():
    """4 rows of each label cannot fill 5 stratified folds: the run takes 4 and says so; one label of 30 rows
    can, and a rarer label is then missing from some folds' rows."""
    ss, taps, reads = noise_set(0)
    few = StateSet(["a", "b"], ss.states[26:34], ss.scores[26:34], ss.gold[26:34])  # 4 + 4 rows
    got = nested.run({"p": few}, taps, nested.Search({"p": reads[:2]}, False, 2, "best", None, 13, outer_folds=5))
    assert got.outer_folds == 4 and len(got.exits) == 4
    rare = StateSet(["a", "b"], ss.states[:34], ss.scores[:34], ss.gold[:34])  # 30 + 4 rows
    got = nested.run({"p": rare}, taps, nested.Search({"p": reads[:2]}, False, 2, "best", None, 13, outer_folds=5))
    assert got.outer_folds == 5 and np.allclose(got.probs["p"].sum(1), 1)
