"""Fitting abstention thresholds for a head on its fitting split (`qcls calibrate --target-precision` /
`--target-coverage`, `--confidence`): per prompt the head's nested out-of-fold probabilities (the whole search of
read, L2 strength and exit run again inside each outer fold: qcls/fitting/nested.py), then the threshold rule of
qcls/heads/thresholds.py (a target precision certified by a lower confidence bound), written into the prompt's
entry of the head file. `out_of_fold` gives the probabilities of one fixed read and strength refitted in the
folds that chose the strength (the non-nested estimate; bench/nested_cv.py compares the two)."""
from __future__ import annotations

from typing import Any

import numpy as np

from qcls.eval.metrics import softmax
from qcls.fitting import heads as H
from qcls.heads import thresholds as T
from qcls.heads.head import Head, PromptHead, Tap


def out_of_fold(ph: PromptHead, states: np.ndarray, taps: list[Tap], scores: np.ndarray, gold: np.ndarray,
                seed: int = 0, leave_out: np.ndarray | None = None) -> np.ndarray:
    """[n, L] probabilities of each labelled query from a head fitted without its fold: the head's read, raw
    scores if it reads them, its C, its folds (info.cv_folds) and the folds' seed, as cross_validate split them.
    `states` [n, taps, H], `scores` [n, L] and `gold` [n] in the head's label order; rows in `leave_out` (indices)
    are scored but no fold's head is fitted on them (qcls/fitting/audit.py: the rows an earlier pass doubts),
    except where a fold would keep no row of a label: there that label's rows stay, since a head that never saw a
    label gives it no probability and every row given it would look wrong."""
    StratifiedKFold = H._sklearn()[0]
    with_scores = ph.score_weights is not None
    x = H.features(states, taps, ph.read, scores if with_scores else None) if ph.read else scores
    folds, C, n_labels = int(ph.info.get("cv_folds", H.FOLDS)), float(ph.info["C"]), len(ph.labels)
    out = np.zeros((len(gold), n_labels))
    for tr, te in StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed).split(np.zeros(len(gold)), gold):
        if leave_out is not None:
            kept = np.setdiff1d(tr, leave_out)
            lost = np.setdiff1d(gold[tr], gold[kept])
            tr = np.union1d(kept, tr[np.isin(gold[tr], lost)])
        f = H.fit_affine(x[tr], gold[tr], n_labels, C)
        out[te] = softmax(x[te] @ f.weights.T + f.bias)
    return out


def fit(head: Head, probs: dict[str, tuple[np.ndarray, np.ndarray, list[str]]], precision: dict[str, float],
        coverage: dict[str, float], fallback: str | None, source: str,
        confidence: float | None = T.CONFIDENCE) -> dict[str, dict[str, Any]]:
    """Set the thresholds of `head`'s prompts in place from held-out `probs` (per prompt: [n, L] probabilities,
    [n] gold indices, the labels in that order). A prompt whose target precision the split cannot reach keeps
    no threshold (it answers every query) and its report says `reached: False` with the best precision and bound
    any threshold gives and the labelled queries that would certify it; nothing is relaxed. A target precision is
    certified at `confidence` (qcls/heads/thresholds.py). Returns per prompt the fit's report."""
    out = {}
    for name in dict.fromkeys([*precision, *coverage]):
        ph = head.prompts.get(name)
        if ph is None or name not in probs:
            out[name] = {"reached": False, "reason": "no head or no labelled query for this prompt"}
            continue
        p, gold, _ = probs[name]
        top, right = p.max(1), p.argmax(1) == gold
        got = T.fit_precision(top, right, precision[name], confidence) if name in precision else \
            T.fit_coverage(top, right, coverage[name])
        got["probabilities"] = source
        if got["reached"]:
            fitted = {k: _round(v) for k, v in got.items() if k != "reached"}
            ph.threshold = T.Threshold(got["threshold"], fallback=fallback, fitted=fitted)
        else:
            ph.threshold = None
        out[name] = got
    return out


def _round(v):
    return round(v, 4) if isinstance(v, float) and v != 1.0 else v


def _promise(f: dict[str, Any]) -> str:
    """'lower bound 0.953 at 90 % confidence' of a precision fit (empty for the point-estimate rule)."""
    if f.get("confidence") is None or f.get("lower_bound") is None:
        return ""
    return f", lower bound {f['lower_bound']:.3f} at {f['confidence']:.0%} confidence"


def head_probs(head: Head, sets: dict, taps: list[Tap], splittings: int = 1,
               leave_out: dict[str, np.ndarray] | None = None,
               outcome=None, folds: int | None = None,
               outer_folds: int | None = None) -> dict[str, tuple[np.ndarray, np.ndarray, list[str]]]:
    """Per prompt with a learned head: nested out-of-fold probabilities of its labelled queries
    (qcls/fitting/nested.py: the search the head file records, run again inside each outer fold), in the head's
    label order; with `splittings` > 1 averaged over that many stratified splittings (seeds 0, 1, …). `leave_out`:
    per prompt the labelled rows (indices) no head is fitted on. `outcome`: the fit's own nested run (seed 0,
    nothing left out), reused instead of running it again. `folds` / `outer_folds`: the user's, else the file's."""
    from qcls.fitting import nested
    search = nested.search_of(head)
    search.folds, search.outer_folds = folds or search.folds, outer_folds or search.outer_folds
    if outcome is not None and splittings == 1 and not leave_out:
        runs = [outcome]
    else:
        runs = [nested.run(sets, taps, search, seed, leave_out) for seed in range(splittings)]
    out = {}
    for name in runs[0].probs:
        ph, ss = head.prompts[name], sets[name]
        idx = [ss.labels.index(lab) for lab in ph.labels]  # the set's label order → the head's
        remap = np.array([ph.labels.index(lab) for lab in ss.labels])
        probs = np.mean([r.probs[name][:, idx] for r in runs], axis=0)
        out[name] = (probs, remap[runs[0].gold[name]], list(ph.labels))
    return out


def table(fits: dict[str, dict[str, Any]], split: str) -> list[str]:
    """Lines for the calibrate report: per prompt the target, the threshold, and the precision and coverage it
    gives on the fitting split's held-out probabilities; an unreachable target says so."""
    lines = [f"thresholds (fitted on {split}, nested out-of-fold probabilities; precision and coverage on that "
             "split; a target precision is kept where its one-sided Clopper–Pearson lower bound reaches it):"]
    for name, f in fits.items():
        target = (f"precision ≥ {f['target_precision']}" if "target_precision" in f else
                  f"coverage ≥ {f['target_coverage']}" if "target_coverage" in f else "")
        if f.get("reached"):
            lines.append(f"  {name}: {target}: threshold {f['threshold']:.4f} → precision {f['precision']:.3f}"
                         f"{_promise(f)}, coverage {f['coverage']:.3f} ({f.get('answered', '')} answered of "
                         f"n={f['n']})")
        elif "best_precision" in f:
            lines += not_reached(name, target, f)
        else:
            lines.append(f"  {name}: {target} not fitted: {f.get('reason')}")
    return lines


def not_reached(name: str, target: str, f: dict[str, Any]) -> list[str]:
    """The lines of a target precision the split cannot certify: the best any threshold gives and what would."""
    bound = f"lower bound {f['best_lower_bound']:.3f} at {f['confidence']:.0%} confidence, " \
        if f.get("best_lower_bound") is not None else ""
    out = [f"  {name}: {target} NOT REACHED on this split: the best any threshold gives is precision "
           f"{f['best_precision']:.3f} ({bound}coverage {f['best_coverage']:.3f}, n={f['n']}); no threshold written, "
           "the prompt answers every query"]
    more = f.get("more_needed")
    if more is not None:
        out.append(f"    about {more} more labelled queries of this prompt would certify it if its best observed "
                   "error rate held: `qcls label-next` picks them; or lower the target or the --confidence")
    elif f.get("confidence") is not None:
        out.append("    no threshold's observed precision is above the target, so more queries alone would not "
                   "certify it: lower the target, or improve the head (more labels: `qcls label-next`)")
    return out


def for_file(args, cfg, data, targets) -> dict[str, Any]:
    """`qcls calibrate --thresholds-for FILE`: thresholds for an existing head file's learned heads (those fitted
    under this config's templates), its heads unchanged, written to --out (default: the file itself)."""
    from pathlib import Path

    from qcls.classifier import Classifier
    from qcls.fitting.head_fitting import read_set
    from qcls.heads import files
    from qcls.heads.files import template_sha256
    from qcls.heads.startup import resolve_path

    path = resolve_path(args.thresholds_for)
    head = files.load(path)
    specs = {p.name: p for p in cfg.prompts}
    served = {}  # per config prompt, the file's head fitted under its template (a variant, maybe)
    for name, spec in specs.items():
        sha = template_sha256(spec.template, spec.label_prefix)
        fitting = [ph for ph in head.candidates(name) if ph.info.get("template_sha256") in (sha, None)
                   and sorted(ph.labels) == sorted(spec.labels)]
        if fitting:
            served[name] = fitting[0]
    view = Head(served, head.method, head.meta)
    from qcls.fitting import nested  # the nested search reads every tap the fit tried, not only those chosen
    taps = list(dict.fromkeys([*view.taps(), *H.taps_of([r for rs in nested.search_of(view).reads.values()
                                                         for r in rs])]))
    clf = Classifier(cfg.model_copy(update={"calibration": None}), taps=taps)
    probs = head_probs(view, read_set(clf, data), taps, folds=args.cv_folds, outer_folds=args.nested_folds)
    fits = fit(view, probs, *targets, args.fallback, "nested out-of-fold", args.confidence)  # sets the thresholds on the file's heads
    out = Path(args.out) if args.out else path
    out.parent.mkdir(parents=True, exist_ok=True)
    files.save(head, out)
    return {"thresholds_only": True, "file": str(out.resolve()), "override": f"calibration={out}",
            "method": head.method, "split": str(data.path), "n_queries": len(data.examples),
            "model": cfg.model.name, "thresholds": fits}


def targets(args, cfg) -> tuple[dict[str, float], dict[str, float]] | None:
    """(per prompt target precision, per prompt target coverage) of calibrate's options, or None when neither
    is asked for."""
    names = [p.name for p in cfg.prompts]
    precision = T.parse_targets(args.target_precision, names, "--target-precision")
    coverage = T.parse_targets(args.target_coverage, names, "--target-coverage")
    both = sorted(set(precision) & set(coverage))
    if both:
        raise ValueError(f"prompts {both} have both a target precision and a target coverage: give one per prompt")
    if not 0.0 < args.confidence < 1.0:
        raise ValueError(f"--confidence {args.confidence}: give a level in (0, 1), e.g. 0.9")
    if args.thresholds_for and not (precision or coverage):
        raise ValueError("--thresholds-for fits thresholds: give --target-precision or --target-coverage")
    return (precision, coverage) if precision or coverage else None


def lines(res: dict[str, Any]) -> list[str]:
    """The calibrate report's threshold lines (none when no threshold was asked for)."""
    return table(res["thresholds"], res["split"]) if res.get("thresholds") else []
