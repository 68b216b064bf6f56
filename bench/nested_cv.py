"""Does a precision target hold on queries nobody has seen, and does the CV accuracy a fit reports? Simulated on the
303 shipped labelled queries (dev + test) for both demo models (docs/evaluation.md, "Abstention thresholds").

Per split (seeded, stratified on both prompts' labels, half and half): the head `qcls calibrate --method head`
fits (every candidate read, one-SE depth rule; `--folds M/K`: K folds choose (`--cv-folds K`) and M outer
folds judge (`--nested-folds M`), `K` alone for M = K) on one half; thresholds for precision 0.95 by the point rule
(the lowest threshold whose observed precision on the non-nested out-of-fold probabilities reaches it) and by the
bound rule (Clopper–Pearson lower bound at 90 % on the nested out-of-fold probabilities: qcls/fitting/nested.py);
both scored on the other half. Reported per model and rule: the share of (split, prompt) pairs certified (a
threshold, 0 included), the share of those whose answered precision on the other half is below 0.95 − 0.02, and the
median coverage there; the CV accuracy (the selection's, the nested one) against the other half's accuracy. With
several fold counts, each fits the same splits, and the nested estimate's paired shift against the first is reported
(the other half's noise cancels in it: few splits suffice to see whether more folds remove a pessimism).

The states are read once per model (`--read-states MODEL`, CPU, into .cache/nested_cv/); the splits are then
pure logistic regression, spread over processes (`simulate`, one per CPU).
"""
from __future__ import annotations

import json
import os
import sys
import time
import warnings
from multiprocessing import Pool
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import common as C  # noqa: E402
from qcls.eval.metrics import softmax  # noqa: E402
from qcls.fitting import head_depth, nested  # noqa: E402
from qcls.fitting import heads as H  # noqa: E402
from qcls.heads.bounds import shown  # noqa: E402
from qcls.fitting.head_fitting import StateSet  # noqa: E402
from qcls.fitting.threshold_fitting import out_of_fold  # noqa: E402
from qcls.heads import thresholds as T  # noqa: E402
from qcls.heads.head import Tap  # noqa: E402

STATES = Path(__file__).resolve().parents[1] / ".cache" / "nested_cv"
MODELS, PROMPTS = ("gemma3_demo", "smollm2_demo"), ("category", "audience")
TARGET, CONFIDENCE, MISS, RULE = 0.95, 0.9, 0.93, "one-se"


def read_states(model: str) -> None:
    """Every candidate tap's states of dev + test, once (the engine's numerics, as calibrate reads them)."""
    from qcls.backends import sources
    from qcls.classifier import Classifier
    from qcls.config.compose import compose
    from qcls.eval.dataset import load_eval_set
    from qcls.fitting.calibrate import split_path
    from qcls.fitting.head_fitting import read_set
    from qcls.heads.weights_fingerprint import num_layers
    over = (C.checkpoint_overrides("tiny") if model == "tiny" else [f"model={model}"]) + ["backend=fp16"]
    cfg = compose(over).model_copy(update={"calibration": None})
    n = num_layers(sources.load_config(sources.resolve(cfg.model, cfg.cache_dir)))
    taps = H.taps_of(H.candidate_reads("auto", "auto", n))
    clf = Classifier(cfg, taps=taps)
    sets = [read_set(clf, load_eval_set(split_path(s), cfg.prompts)) for s in ("dev", "test")]
    out = {"taps": np.array([f"{t.layer}|{t.kind}" for t in taps]), "num_layers": np.array(n)}
    for p in PROMPTS:
        out[f"{p}/labels"] = np.array(sets[0][p].labels)
        for key in ("states", "scores", "gold"):
            out[f"{p}/{key}"] = np.concatenate([getattr(s[p], key) for s in sets])
    STATES.mkdir(parents=True, exist_ok=True)
    np.savez(STATES / f"{model}.npz", **out)


def load(model: str):
    z = np.load(STATES / f"{model}.npz")
    taps = [Tap(int(a) if a.isdigit() else a, b) for a, b in (t.split("|") for t in z["taps"])]
    sets = {p: StateSet(list(z[f"{p}/labels"]), z[f"{p}/states"], z[f"{p}/scores"], z[f"{p}/gold"]) for p in PROMPTS}
    return sets, taps, int(z["num_layers"])


def halves(sets: dict, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded half-half split of the rows, stratified on the pair of labels (a rare pair as well as may be)."""
    from sklearn.model_selection import StratifiedKFold
    key = np.unique(np.stack([sets[p].gold for p in PROMPTS], 1), axis=0, return_inverse=True)[1].ravel()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a, b = next(StratifiedKFold(2, shuffle=True, random_state=seed).split(np.zeros(len(key)), key))
    return a, b


def sub(ss: StateSet, rows: np.ndarray) -> StateSet:
    return StateSet(ss.labels, ss.states[rows], ss.scores[rows], ss.gold[rows])


def fold_counts(spec: str) -> tuple[int, int]:
    """`M/K` → (M outer, K inner) folds; `K` → (K, K)."""
    outer, _, inner = str(spec).partition("/")
    return int(outer), int(inner or outer)


def one_split(task: tuple[str, int, str, str]) -> list[dict]:
    """Per prompt: the other half's accuracy, the two CV estimates, and each rule's threshold scored there."""
    model, seed, kind, spec = task
    outer, folds = fold_counts(spec)
    sets, taps, n = load(model)
    a, b = halves(sets, seed)
    fit, other = {p: sub(ss, a) for p, ss in sets.items()}, {p: sub(ss, b) for p, ss in sets.items()}
    reads = H.candidate_reads("auto", kind, n)
    t0 = time.perf_counter()
    tried = {p: H.cv_reads(ss.states, taps, ss.scores, ss.gold, len(ss.labels), reads, False, folds=folds)
             for p, ss in fit.items()}
    choice = head_depth.choose(tried, n, RULE)
    heads = {p: H.fit_read(fit[p].states, taps, fit[p].scores, fit[p].gold, fit[p].labels, r, tried[p], False, folds)
             for p, r in choice.reads.items()}
    t1 = time.perf_counter()
    outcome = nested.run(fit, taps, nested.Search({p: reads for p in fit}, False, folds, RULE, None, n, outer))
    t2 = time.perf_counter()
    rows = []
    for p, ph in heads.items():
        prob = softmax(H.features(other[p].states, taps, ph.read, None) @ ph.feature_weights.T + ph.bias)
        top, right = prob.max(1), prob.argmax(1) == other[p].gold
        row = {"model": model, "folds": str(spec), "seed": seed, "prompt": p, "n_fit": len(a), "n_other": int(len(b)),
               "read": f"{ph.read.kind}@{ph.read.layer}", "other_accuracy": float(right.mean()),
               "cv_current": choice.reads[p].accuracy, "cv_nested": outcome.accuracy(p),
               "seconds_selection": t1 - t0, "seconds_nested": t2 - t1}
        oof = {"point": out_of_fold(ph, fit[p].states, taps, fit[p].scores, fit[p].gold), "bound": outcome.probs[p]}
        for rule, conf in (("point", None), ("bound", CONFIDENCE)):
            q = oof[rule]
            got = T.fit_precision(q.max(1), q.argmax(1) == fit[p].gold, TARGET, conf)
            ans = top >= got["threshold"] if got["reached"] else np.zeros(len(top), bool)
            row[rule] = {"reached": got["reached"], "threshold": got["threshold"], "answered": int(ans.sum()),
                         "right": int((ans & right).sum()), "more_needed": got.get("more_needed")}
        rows.append(row)
    return rows


def summary(rows: list[dict]) -> str:
    """The markdown table: per model, folds and rule; the cost per fit; with several folds, the nested estimate's
    paired shift against the first."""
    for r in rows:
        r["folds"] = str(r.get("folds", 3))  # a rows file without the field was fitted with 3 folds
    out = ["| model | folds (outer/inner) | rule | certified pairs | of those, precision on the other half < 0.93 | uncertified | "
           "median coverage, certified (all pairs) | mean CV accuracy − other half's ± s.e. (mean abs) |",
           "|---|---|---|---|---|---|---|---|"]
    groups = list(dict.fromkeys((r["model"], r["folds"]) for r in rows))
    for model, folds in groups:
        mine = [r for r in rows if (r["model"], r["folds"]) == (model, folds)]
        for rule, cv in (("point", "cv_current"), ("bound", "cv_nested")):
            cert = [r for r in mine if r[rule]["reached"]]
            miss = [r for r in cert if r[rule]["answered"] and r[rule]["right"] / r[rule]["answered"] < MISS]
            cov = [r[rule]["answered"] / r["n_other"] for r in cert]
            cov_all = cov + [0.0] * (len(mine) - len(cert))
            gap = np.array([r[cv] - r["other_accuracy"] for r in mine])
            name = {"point": "point: observed precision ≥ 0.95, out-of-fold after the choice",
                    "bound": "bound: 90 % Clopper–Pearson lower bound ≥ 0.95, nested out-of-fold"}[rule]
            out.append(f"| {model} | {folds} | {name} | {len(cert)} of {len(mine)} | {len(miss)} = "
                       f"{shown(len(miss), len(cert)) if cert else '-'} | {(len(mine) - len(cert)) / len(mine):.2f} | "
                       f"{np.median(cov) if cov else 0:.3f} ({np.median(cov_all):.3f}) | {gap.mean():+.4f} ± "
                       f"{_se(gap):.4f} ({np.abs(gap).mean():.4f}) |")
    out.append("")
    def mean(key, m, k):
        return np.mean([r[key] for r in rows if (r["model"], r["folds"]) == (m, k)])
    out.append("Cost per fit (one process, about 151 queries, the candidate reads above): " + "; ".join(
        f"{m}, {k} folds: the search {mean('seconds_selection', m, k):.0f} s, the nested cross-validation "
        f"{mean('seconds_nested', m, k):.0f} s more" for m, k in groups))
    shifts = _shifts(rows, groups)
    if shifts:
        out += ["", "More folds against the first, paired on the same (split, prompt) pairs (mean ± s.e.; the other "
                "half's noise cancels): " + "; ".join(shifts)]
    return "\n".join(out)


def _se(x: np.ndarray) -> float:
    return float(np.std(x, ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan")


def _shifts(rows: list[dict], groups: list[tuple[str, int]]) -> list[str]:
    """Per model and folds after its first, over the (split, prompt) pairs both fitted: the nested gap (nested CV
    accuracy − the other half's) at K − at the first K, and the nested CV accuracy's own shift."""
    out = []
    for model in dict.fromkeys(m for m, _ in groups):
        ks = [k for m, k in groups if m == model]  # in the order asked: the first is the baseline
        at = {k: {(r["seed"], r["prompt"]): (r["cv_nested"] - r["other_accuracy"], r["cv_nested"]) for r in rows
                  if (r["model"], r["folds"]) == (model, k)} for k in ks}
        for k in ks[1:]:
            both = sorted(set(at[k]) & set(at[ks[0]]))
            d = np.array([[a - b for a, b in zip(at[k][x], at[ks[0]][x])] for x in both]).reshape(-1, 2)
            if len(d):
                out.append(f"{model}, {k} − {ks[0]} folds: gap {d[:, 0].mean():+.4f} ± {_se(d[:, 0]):.4f}, nested "
                           f"accuracy {d[:, 1].mean():+.4f} ± {_se(d[:, 1]):.4f} ({len(d)} pairs)")
    return out


def main() -> None:
    ap = C.parser(__doc__)
    ap.add_argument("what", choices=["read-states", "simulate", "table"])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=[*MODELS, "tiny"],
                    help="tiny: a random-weight model, the smoke")
    ap.add_argument("--splits", type=int, default=30)
    ap.add_argument("--json", default=str(STATES / "rows.json"), help="the per-pair rows (simulate writes, table "
                    "reads; comma-separated files are joined)")
    ap.add_argument("--read", default="auto", choices=["auto", "position"], help="the candidate reads' kinds "
                    "(position: one kind per layer, a third of the search's cost)")
    ap.add_argument("--folds", nargs="+", default=["5/3"], metavar="M/K", help="the fit's folds: M outer (`qcls "
                    "calibrate --nested-folds M`) around K that choose (`--cv-folds K`), K alone for M = K; several: "
                    "each on the same splits, the first the baseline of the paired shifts (default 5/3, calibrate's)")
    ap.add_argument("--workers", type=int, help="processes (default: one per CPU)")
    ap.add_argument("--where", default="", help="where the splits were simulated, for the record")
    args = ap.parse_args()
    if args.what == "read-states":
        for m in args.models:
            read_states(m)
        return
    if args.what == "simulate":
        for m in args.models:  # states not read yet: read them first
            if not (STATES / f"{m}.npz").is_file():
                read_states(m)
        bad = [f for f in args.folds if not all(p.isdigit() and int(p) >= 2 for p in f.split("/", 1))]
        if bad:
            ap.error(f"--folds {bad[0]}: give M/K or K, each at least 2 (cross-validation needs 2 folds)")
        # split by split, every model and K: a run cut short keeps paired rows
        tasks = [(m, s, args.read, k) for s in range(args.splits) for m in args.models for k in args.folds]
        rows: list[dict] = []
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with Pool(args.workers or os.cpu_count() or 1) as pool:
            for got in pool.imap_unordered(one_split, tasks):  # saved as they come: a cut-short run keeps its rows
                rows += got
                Path(args.json).write_text(json.dumps(rows))
                print(f"{len(rows) // len(PROMPTS)} of {len(tasks)} fits", flush=True)
    rows = [r for f in args.json.split(",") for r in json.loads(Path(f).read_text())]
    folds = list(dict.fromkeys(str(r.get("folds", 3)) for r in rows))
    splits = len({r["seed"] for r in rows})
    config = (f"{splits} seeded stratified half-half splits of the 303 labelled queries; heads by `qcls calibrate "
              f"--method head` (--layer auto --read {args.read}, {RULE}; folds outer/inner {', '.join(folds)}); "
              f"target precision {TARGET}; {args.where}")
    C.report(C.header("Precision targets and CV accuracy on the other half: nested CV and a bound against the point "
                      "estimate's rule", config) + summary(rows) + "\n", args.no_append)


if __name__ == "__main__":
    main()
