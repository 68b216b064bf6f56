"""From a labelled split to a saved head: read the states with qcls's own engine (the numerics of serving,
batched), fit each prompt's head (qcls/fitting/heads.py), and pin the result to the model, prompts and split.
Used by `qcls calibrate --method head` and by sweep jobs with eval.fit_method=head."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from qcls.fitting import head_depth, nested
from qcls.fitting import heads as H
from qcls.eval.dataset import EvalSet
from qcls.eval.scores import EvalRunError
from qcls.heads import weights_fingerprint as fp
from qcls.heads.files import now, template_sha256
from qcls.heads.head import Head, Read, Tap


@dataclass
class StateSet:
    """One prompt over a labelled set (rows in set order)."""
    labels: list[str]
    states: np.ndarray  # [n, taps, H] float32
    scores: np.ndarray  # [n, L] raw scores
    gold: np.ndarray  # [n] label index, −1 where the query has no gold label for this prompt

    def labelled(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        m = self.gold >= 0
        return self.states[m], self.scores[m], self.gold[m]


def read_set(clf, data: EvalSet) -> dict[str, StateSet]:
    """Per prompt the states of every tap the Classifier keeps, its raw scores and the gold indices."""
    results, states = clf.read_states(data.queries)
    bad = [(e, r.error) for e, r in zip(data.examples, results) if not r.ok]
    if bad:
        shown = "; ".join(f"line {e.line} {e.query!r}: {err}" for e, err in bad[:3])
        raise EvalRunError(f"{data.path}: {len(bad)} queries refused by the classifier ({shown}); fix those lines "
                           "or raise max_query_tokens")
    stacked = np.stack([s.numpy() for s in states])  # [n, taps, prompts, H]
    out = {}
    for j, name in enumerate(clf.prompt_names):
        labels = [ls.label for ls in results[0].prompts[j].labels]
        index = {lab: i for i, lab in enumerate(labels)}
        scores = np.array([[ls.score for ls in r.prompts[j].labels] for r in results], dtype=np.float64)
        gold = np.array([index[e.labels[name]] if name in e.labels else -1 for e in data.examples], dtype=np.int64)
        out[name] = StateSet(labels, stacked[:, :, j], scores, gold)
    return out


def check_fit_split(data: EvalSet, prompts, folds: int) -> list[str]:
    """Refuse (FitError) before the model loads when a prompt's labelled queries cannot give a head; prompts
    with no labelled query at all are left without a head (returned as notes)."""
    notes = []
    for p in prompts:
        gold = [p.labels.index(e.labels[p.name]) for e in data.examples if p.name in e.labels]
        if not gold:
            notes.append(f"prompt {p.name!r} has no labelled query in {data.path}: it gets no head")
            continue
        H.check_split(np.array(gold), p.labels, folds, p.name, str(data.path))
    return notes


def fit(clf, sets: dict[str, StateSet], taps: list[Tap], reads: Sequence[Read], with_scores: bool, folds: int,
        fitted_on: str, seed: int = 0, rule: str = "one-se", max_layer: int | None = None,
        nested_folds: int = nested.NESTED_FOLDS) -> Head:
    """Every prompt's head (prompts without labelled queries get none), its read chosen for the prompt set as a
    whole by `rule` (qcls/fitting/head_depth.py; recorded in `meta.depth`), and the metadata that pins the file."""
    return fit_nested(clf, sets, taps, reads, with_scores, folds, fitted_on, seed, rule, max_layer, nested_folds)[0]


def fit_nested(clf, sets: dict[str, StateSet], taps: list[Tap], reads: Sequence[Read], with_scores: bool,
               folds: int, fitted_on: str, seed: int = 0, rule: str = "one-se",
               max_layer: int | None = None,
               nested_folds: int = nested.NESTED_FOLDS) -> tuple[Head, nested.Outcome]:
    """`fit`, and the nested cross-validation of the whole fit (qcls/fitting/nested.py, `nested_folds` outer
    folds around the search's `folds`): each prompt's
    `info.cv_accuracy` / `cv_log_loss` are the nested ones (`selection_cv_accuracy`: the chosen read's in the
    folds that chose it, optimistic), and its out-of-fold probabilities are returned for thresholds and audits."""
    cfg = clf.cfg
    fitted_on = _shown(fitted_on)
    specs = {p.name: p for p in cfg.prompts}
    num_layers = fp.num_layers(clf.loaded.model.config)
    tried, labelled = {}, {}
    for name, ss in sets.items():
        labelled[name] = ss.labelled()
        states, scores, gold = labelled[name]
        if not len(gold):
            continue
        H.check_split(gold, ss.labels, folds, name, fitted_on)
        tried[name] = H.cv_reads(states, taps, scores, gold, len(ss.labels), reads, with_scores, folds=folds,
                                 seed=seed)
    choice = head_depth.choose(tried, num_layers, rule, max_layer,
                               "the heads read the raw label scores (--with-scores)" if with_scores else None)
    prompts = {}
    for name, chosen in choice.reads.items():
        states, scores, gold = labelled[name]
        ph = H.fit_read(states, taps, scores, gold, sets[name].labels, chosen, tried[name], with_scores, folds)
        ph.info["template_sha256"] = template_sha256(specs[name].template, specs[name].label_prefix)
        prompts[name] = ph
    unheaded = [n for n in sets if n not in prompts]
    if unheaded:
        choice.notes.append(f"{', '.join(unheaded)}: no head (no labelled query), so a forward serving "
                            f"{'it' if len(unheaded) == 1 else 'them'} runs all {num_layers} layers")
    meta = pin(clf, fitted_on, with_scores, {n: int((s.gold >= 0).sum()) for n, s in sets.items()})
    meta["depth"] = choice.as_meta()
    outcome = nested.run(sets, taps, nested.Search({n: list(reads) for n in tried}, with_scores, folds, rule,
                                                   max_layer, num_layers, nested_folds), seed)
    for name, ph in prompts.items():
        ph.info["selection_cv_accuracy"] = ph.info["cv_accuracy"]
        ph.info["cv"] = "nested"
        ph.info["nested_folds"] = outcome.outer_folds
        ph.info["cv_accuracy"] = round(outcome.accuracy(name), 4)
        ph.info["cv_log_loss"] = round(outcome.log_loss(name), 4)
    return Head(prompts, "head", meta), outcome


def _shown(path: str) -> str:
    """A shipped fitting file by its path inside the package (a shipped head names data/eval/…), else as is."""
    from qcls.config.paths import shown
    return shown(path)


def pin(clf, fitted_on: str, with_scores: bool, n: dict[str, int]) -> dict:
    """What a head file records about where it came from (checked at start-up: qcls/heads/startup.py). The qcls
    version, not a commit: a shipped head file names no commit (the docs and package say what is)."""
    from qcls import __version__
    model = clf.loaded.model
    meta = {"model": clf.cfg.model.name, "hidden_size": fp.hidden_size(model.config),
            "num_layers": fp.num_layers(model.config),
            "fingerprint": {"config": fp.config_fingerprint(model.config), "weights": fp.weights_fingerprint(model)},
            "config": fp.config_facts(model.config), "fitted_on": fitted_on, "n": n, "date": now(),
            "qcls": __version__, "dtype": str(clf.loaded.dtype).replace("torch.", ""),
            "device": str(clf.loaded.device), "backend": clf.loaded.backend}
    if with_scores:  # the raw scores are features: the strategy that made them matters
        meta["strategy"] = clf.cfg.strategy
    return meta


def head_scores(head: Head, sets: dict[str, StateSet], taps: list[Tap]) -> dict[str, np.ndarray]:
    """Per prompt the head's logits [n, L] of a set (the prompt's raw scores where it has no head), in
    float64 from the extracted states: what the engine's tail computes (tests hold the two equal)."""
    out = {}
    for name, ss in sets.items():
        ph = head.prompts.get(name)
        if ph is None:
            out[name] = ss.scores.copy()
            continue
        x = H.features(ss.states, taps, ph.read, None) if ph.read else None
        logits = np.tile(ph.bias, (len(ss.gold), 1))
        if ph.score_weights is not None:
            logits += ss.scores @ ph.score_weights.T
        if x is not None:
            logits += x @ ph.feature_weights.T
        out[name] = logits
    return out


def sweep_block(spec, cfg, loaded, per: dict, fit_data: EvalSet, data: EvalSet, out_dir) -> tuple[dict, dict]:
    """A sweep job's head (eval.fit_method=head): fitted on `fit_data` with the job's head options, saved as
    head.yaml + head.safetensors in the job folder, scored on `data` against the raw scores (`per`), with the
    learning curve. Returns (the result's `calibration` block, per prompt head probabilities)."""
    from qcls.classifier import Classifier
    from qcls.fitting import calibrated_metrics
    from qcls.eval import metrics
    from qcls.heads import files
    hs = spec.head
    n_layers = fp.num_layers(loaded.model.config)
    reads = head_depth.within(H.candidate_reads(str(hs.layer), hs.read, n_layers), n_layers, hs.max_layer)
    taps = H.taps_of(reads)
    notes = check_fit_split(fit_data, cfg.prompts, hs.cv_folds)
    clf = Classifier(cfg.model_copy(update={"calibration": None}), loaded=loaded, taps=taps)
    fit_sets, eval_sets = read_set(clf, fit_data), read_set(clf, data)
    head = fit(clf, fit_sets, taps, reads, hs.scores, hs.cv_folds, str(fit_data.path), rule=hs.layer_rule,
               max_layer=hs.max_layer, nested_folds=hs.nested_folds)
    del clf
    files.save(head, out_dir / "head.yaml")
    logits = head_scores(head, eval_sets, taps)
    n_fit = {p: int(v) for p, v in head.meta["n"].items()}
    block = calibrated_metrics.columns(per, logits, f"head fitted on {fit_data.path}", "head", n_fit)
    block["file"] = str(out_dir / "head.yaml")
    block["notes"] = notes
    block["heads"] = {p: {"read": ph.read.as_dict() if ph.read else None, "scores": ph.score_weights is not None,
                          **{k: ph.info[k] for k in ("C", "cv_accuracy", "cv_log_loss") if k in ph.info}}
                      for p, ph in head.prompts.items()}
    block["depth"] = head.meta["depth"]
    block["forward"] = head_depth.forward_costs(serving_reads(head, list(per)), head.meta["num_layers"])
    block["learning_curve"] = curve(head, fit_sets, eval_sets, taps, hs.curve_sizes, hs.curve_draws)
    return block, {p: metrics.softmax(v) for p, v in logits.items()}


def serving_reads(head: Head | None, prompts: list[str]) -> dict[str, int | str | None]:
    """Per prompt the layer its head reads, None where the forward must run all layers for it (no head, or a
    head that reads the raw scores)."""
    out: dict[str, int | str | None] = {}
    for p in prompts:
        ph = head.prompts.get(p) if head is not None else None
        out[p] = ph.read.layer if ph is not None and ph.read is not None and ph.score_weights is None else None
    return out


def curve(head: Head, fit_sets: dict[str, StateSet], eval_sets: dict[str, StateSet], taps: list[Tap],
          sizes: Sequence[int], draws: int) -> dict:
    """Held-out accuracy against the number of fitting queries, per prompt (each prompt's chosen read and L2
    strength) and its mean over prompts; a size is the number of the split's labelled queries for that prompt
    (all of them: `all`); `n_eval`: per prompt the labelled queries each accuracy is measured on."""
    per_prompt: dict[str, dict[str, list[float]]] = {}
    n_eval: dict[str, int] = {}
    for name, ph in head.prompts.items():
        fs, fsc, fy = fit_sets[name].labelled()
        es, esc, ey = eval_sets[name].labelled()
        if not len(ey):
            continue
        with_scores = ph.score_weights is not None
        fx = H.features(fs, taps, ph.read, fsc if with_scores else None) if ph.read else fsc
        ex = H.features(es, taps, ph.read, esc if with_scores else None) if ph.read else esc
        got = H.learning_curve(fx, fy, ex, ey, len(ph.labels), ph.info["C"], sizes, draws)
        per_prompt[name] = {("all" if n == len(fy) else str(n)): accs for n, accs in got.items()}
        n_eval[name] = int(len(ey))
    keys = [k for k in [*map(str, sizes), "all"] if per_prompt and all(k in v for v in per_prompt.values())]
    mean = {k: float(np.mean([np.mean(v[k]) for v in per_prompt.values()])) for k in keys}
    return {"sizes": keys, "draws": draws, "mean_accuracy": mean, "per_prompt": per_prompt, "n_eval": n_eval}
