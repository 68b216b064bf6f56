"""Nested cross-validation of a head fit: held-out probabilities and accuracy from heads that never saw a row in any
choice (docs/evaluation.md, "Learned heads").

A head fit chooses things on its fitting split: per prompt the read and L2 strength (cross-validation), and for
the prompt set the exit (the depth rule, qcls/fitting/head_depth.py). The folds that made those choices flatter
the winner, so their held-out figures are optimistic. Here the whole search runs again inside each outer fold:
per prompt, stratified outer folds (`outer_folds`, seed `seed`) over its labelled rows; at outer fold k every
prompt's candidate reads are cross-validated on its rows outside fold k (`folds` inner folds, as the fit's own
search), the depth rule
chooses the reads for the set, each prompt's chosen head is fitted on those rows and scores its rows in fold k.
Every row is scored once, by a head whose read, strength, exit and weights were chosen without its label.
These probabilities are what abstention thresholds and the audit judge, and their accuracy is the head's
`cv_accuracy`. The exit is chosen for the prompt set, so another prompt's label of the same query may take part
in the choice for this prompt; this prompt's label never does.

Why more outer than inner folds: each outer fold's head is fitted on (outer − 1) / outer of the rows while the
saved head is fitted on all of them, and heads still gain from more queries at these sizes, so few outer folds
make the estimate pessimistic (on the demos' 151 queries, 3: −0.020 / −0.030, 5: −0.009 / −0.013 against new
queries, bench/RESULTS.md); the inner folds only rank candidates, and 5 of them would double the cost again.

Cost: the search runs outer_folds + 1 times instead of once (measured in bench/RESULTS.md); with one read
(`--layer N --read K`) only the L2 strength is searched and the whole is a few seconds.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from qcls.fitting import head_depth
from qcls.fitting import heads as H
from qcls.heads.head import FINAL, Head, Read, Tap

NESTED_FOLDS = 5  # the outer folds' default (module docstring: why more than the search's)


@dataclass
class Search:
    """What a head fit chose among: per prompt its candidate reads, whether the raw scores are features, the
    search's folds, the depth rule and cap, the model's depth; and the nested cross-validation's outer folds."""
    reads: dict[str, list[Read]]
    with_scores: bool
    folds: int
    rule: str
    max_layer: int | None
    num_layers: int
    outer_folds: int = NESTED_FOLDS


@dataclass
class Outcome:
    """Per prompt the nested out-of-fold probabilities [n, L] of its labelled rows (the StateSet's label order),
    their gold indices, and per outer fold the exit the depth rule chose."""
    probs: dict[str, np.ndarray]
    gold: dict[str, np.ndarray]
    exits: list
    outer_folds: int = NESTED_FOLDS  # as run: fewer than asked where no label of a prompt has that many rows

    def accuracy(self, prompt: str) -> float:
        return float(np.mean(self.probs[prompt].argmax(1) == self.gold[prompt]))

    def log_loss(self, prompt: str) -> float:
        p = self.probs[prompt][np.arange(len(self.gold[prompt])), self.gold[prompt]]
        return float(np.mean(-np.log(np.clip(p, 1e-300, None))))


def search_of(head: Head) -> Search:
    """The search a head file records: each prompt's reads tried (`info.reads_tried`, else its one read), the
    folds, the nested cross-validation's outer folds (`info.nested_folds`; a file without it was judged with the
    search's folds), and `meta.depth`'s rule and cap (a file without it: each prompt's most accurate read, rule
    best)."""
    reads, folds, outer = {}, H.FOLDS, None
    for name, ph in head.prompts.items():
        if ph.read is None or "C" not in ph.info:
            continue
        tried = ph.info.get("reads_tried") or {}
        reads[name] = [_read(k) for k in tried] if tried else [ph.read]
        folds = int(ph.info.get("cv_folds", folds))
        outer = int(ph.info.get("nested_folds", folds))
    depth = head.meta.get("depth") or {}
    with_scores = any(ph.score_weights is not None for ph in head.prompts.values())
    num_layers = int(head.meta.get("num_layers") or depth.get("num_layers") or 1 + max(
        [r.layer for rs in reads.values() for r in rs if r.layer != FINAL], default=1))
    return Search(reads, with_scores, folds, depth.get("rule", "best"), depth.get("max_layer"), num_layers,
                  outer or folds)


def _read(name: str) -> Read:
    kind, _, layer = name.partition("@")
    return Read(int(layer) if layer.isdigit() else layer, kind)


def run(sets: dict, taps: list[Tap], search: Search, seed: int = 0,
        leave_out: dict[str, np.ndarray] | None = None) -> Outcome:
    """The nested cross-validation (module docstring) of the prompts in `search.reads` over `sets` (per prompt a
    qcls/fitting/head_fitting.py StateSet). `leave_out`: per prompt labelled rows (indices) that no head is fitted
    on but that are scored (qcls/fitting/audit.py), except where a fold would keep no row of a label."""
    from qcls.eval.metrics import softmax
    StratifiedKFold = H._sklearn()[0]
    data, splits, probs = {}, {}, {}
    for name in search.reads:
        states, scores, gold = sets[name].labelled()
        if len(gold):
            data[name] = (states, scores if search.with_scores else None, gold, len(sets[name].labels))
    # stratified folds need one label with a row in each; a rarer label is missing from some folds' rows
    outer = min([search.outer_folds, *(int(np.bincount(d[2]).max()) for d in data.values())])
    for name, (_, _, gold, n_labels) in data.items():
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "The least populated class", UserWarning)
            splits[name] = list(StratifiedKFold(n_splits=outer, shuffle=True, random_state=seed)
                                .split(np.zeros(len(gold)), gold))
        probs[name] = np.zeros((len(gold), n_labels))
    full_depth = "the heads read the raw label scores" if search.with_scores else None
    exits = []
    with H.one_thread():
        for k in range(outer):
            train, tried = {}, {}
            for name, (states, scores, gold, n_labels) in data.items():
                tr = _kept(splits[name][k][0], gold, (leave_out or {}).get(name))
                train[name] = tr
                inner = max(2, min(search.folds, int(np.bincount(gold[tr])[np.unique(gold[tr])].min())))
                tried[name] = H.cv_reads(states[tr], taps, scores[tr] if scores is not None else None, gold[tr],
                                         n_labels, search.reads[name], search.with_scores, folds=inner, seed=seed)
            choice = head_depth.choose(tried, search.num_layers, search.rule, search.max_layer, full_depth)
            exits.append(choice.exit)
            for name, chosen in choice.reads.items():
                states, scores, gold, n_labels = data[name]
                te, tr = splits[name][k][1], train[name]
                x = H.features(states, taps, chosen.read, scores)
                f = H.fit_affine(x[tr], gold[tr], n_labels, chosen.C)
                probs[name][te] = softmax(x[te] @ f.weights.T + f.bias)
    return Outcome(probs, {n: d[2] for n, d in data.items()}, exits, outer)


def _kept(tr: np.ndarray, gold: np.ndarray, leave_out: np.ndarray | None) -> np.ndarray:
    """A fold's training rows less `leave_out`, keeping the left-out rows of a label that would otherwise have
    none (a head that never saw a label gives it no probability, and every row given it would look wrong)."""
    if leave_out is None:
        return tr
    kept = np.setdiff1d(tr, leave_out)
    lost = np.setdiff1d(gold[tr], gold[kept])
    return np.union1d(kept, tr[np.isin(gold[tr], lost)])
