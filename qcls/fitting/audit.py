"""`qcls audit`: the labels of a labelled file that a held-out head finds unlikely, ranked, with the label it
suggests (docs/evaluation.md, "Finding wrong labels").

The head is the one `qcls calibrate --method head` fits, with the same options (qcls/fitting/head_options.py); each
row's probabilities are nested out of fold: from heads whose read, L2 strength, exit and weights were all
chosen without the row's fold (qcls/fitting/nested.py), averaged over --cv-splittings stratified splittings
(the first is the fit's own; qcls/fitting/threshold_fitting.py `head_probs`). On them, per prompt, confident learning (Northcutt, Jiang & Chuang,
2021):

- label j's threshold t_j = the mean out-of-fold probability of j over the rows given j;
- the confident joint C[i][j] counts the rows given i whose most probable label among those at or over their
  thresholds is j (a row with none is not counted); calibrated to the n_i rows given each label,
  n·Q[i][j] = n_i · C[i][j] / Σ_j C[i][j], and the estimated number of wrong labels is its off-diagonal sum;
- the flagging rule (--filter; cleanlab's `filter_by`), the default chosen on the dev split's simulation
  (bench/audit.py): `confident_joint` flags a row given i when its label in the joint is another label k
  (p_k ≥ t_k); `prune_by_noise_rate` flags, per off-diagonal cell (i, j), the round(n·Q[i][j]) rows given i
  with the largest margin p_j − p_i; `prune_by_class`, per label i, the round(Σ_{j≠i} n·Q[i][j]) rows given i
  with the lowest p_i; `both` the rows both of those flag;
- under every rule a row whose given label is at least as probable as the suggested one is not flagged; the
  suggested label is k (confident_joint) or the most probable other label; flagged rows are ranked by p_i (the
  given label's self-confidence), lowest first;
- with --passes 2 (the default, chosen on the dev split like the rule) the audit makes two passes: the rows the first
  pass flags are left out of the second pass's fitting (each row is still scored by heads fitted without its
  fold), so a wrong label does not pull the heads that judge the other rows towards it; the second pass's
  thresholds are the first pass's means over the rows it did not flag (a label none of whose rows is left keeps
  its own), which a cleaner head cannot raise past a plainly wrong row; its flags and estimate are the audit's.

Flags are candidates to read, not verdicts; a confident disagreement may also be a gap in the label definitions.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qcls.config.compose import ConfigError
from qcls.fitting import head_options
from qcls.heads.head import Head, Tap

COLUMNS = ("query", "prompt", "given", "suggested", "given_prob", "suggested_prob", "rank")
DEFAULT_OUT = "audit.csv"
SHOWN = 5  # the most doubtful rows of each prompt shown on stderr
FILTERS = ("confident_joint", "prune_by_noise_rate", "prune_by_class", "both")  # the first is the default
DEFAULT_SPLITTINGS = 5
# the audit's outer folds: on the dev split 5 flagged the same rows as 3 (bench/RESULTS.md, "Audit on the dev split:
# 5 folds against 3"), and each of the splittings costs a search per fold
AUDIT_NESTED_FOLDS = 3
PASSES = (1, 2)
DEFAULT_PASSES = 2

EPILOG = """examples:
  qcls audit my_labels.csv                                   # audit.csv: the doubtful labels, most doubtful first
  qcls audit my_labels.jsonl prompts=ecommerce8 --out doubts.csv --json
  qcls audit dev --layer 13 --read position                  # the shipped dev split, the head's read fixed

Each flagged (query, prompt) is a row of the CSV: the given label, the label the held-out head suggests, both
probabilities and the rank (1 = the least likely given label). stderr summarises each prompt: its labelled rows,
the rows flagged, the estimated number of wrong labels and the most doubtful ones. Read the flagged rows: some
are right labels the head gets wrong, and a confident disagreement may be a case the label definitions do not
cover (is a phone charger `other`, "any other product", or `none` in a fashion shop?). Every label needs
--cv-folds examples. See docs/evaluation.md."""


@dataclass
class Found:
    """Confident learning on one prompt's out-of-fold probabilities."""
    thresholds: np.ndarray  # [L] t_j
    joint: np.ndarray  # [L, L] confident joint, rows = given label
    flagged: np.ndarray  # row indices, lowest self-confidence first
    suggested: np.ndarray  # per flagged row, the suggested label's index
    estimate: float  # estimated wrong labels


def label_thresholds(probs: np.ndarray, given: np.ndarray, doubted: np.ndarray | None = None) -> np.ndarray:
    """[L] each label's threshold: its mean probability over the rows given it that are not in `doubted`
    (indices; over all of them where none is left); a label nobody gave, never reached (inf)."""
    trusted = np.ones(len(given), bool)
    if doubted is not None:
        trusted[doubted] = False
    out = np.full(probs.shape[1], np.inf)
    for j in range(probs.shape[1]):
        rows = given == j
        if rows.any():
            kept = rows & trusted
            out[j] = probs[kept if kept.any() else rows, j].mean()
    return out


def confident_learning(probs: np.ndarray, given: np.ndarray, rule: str = FILTERS[0],
                       thresholds: np.ndarray | None = None) -> Found:
    """`probs` [n, L] out-of-fold probabilities, `given` [n] label indices (every label given at least once);
    `rule` one of FILTERS (the module docstring); `thresholds` [L] where not the mean of `probs` over each label's
    rows (a later pass keeps the first pass's)."""
    n, n_labels = probs.shape
    rows = np.arange(n)
    counts = np.bincount(given, minlength=n_labels)
    if thresholds is None:
        thresholds = label_thresholds(probs, given)
    above = probs >= thresholds
    likely = np.where(above, probs, -1.0).argmax(1)  # the most probable label among those over their thresholds
    joint = np.zeros((n_labels, n_labels), dtype=np.int64)
    has = above.any(1)
    np.add.at(joint, (given[has], likely[has]), 1)
    wrong = counts[:, None] * joint / np.maximum(joint.sum(1), 1)[:, None]  # n·Q: calibrated to the n_i rows
    np.fill_diagonal(wrong, 0.0)
    p_given = probs[rows, given]
    if rule == "confident_joint":
        suggested = likely
        flag = has & (likely != given)
    else:
        others = probs.copy()
        others[rows, given] = -1.0
        suggested = others.argmax(1)  # the most probable other label
        by_rate, by_class = np.zeros(n, bool), np.zeros(n, bool)
        for i in range(n_labels):
            mine = np.flatnonzero(given == i)
            for j in range(n_labels):  # cell (i, j): the rows given i with the largest margin p_j − p_i
                k = int(round(wrong[i, j]))
                by_rate[mine[np.argsort(probs[mine, i] - probs[mine, j], kind="stable")[:k]]] = True
            k = int(round(wrong[i].sum()))  # label i: its rows with the lowest p_i
            by_class[mine[np.argsort(probs[mine, i], kind="stable")[:k]]] = True
        flag = {"prune_by_noise_rate": by_rate, "prune_by_class": by_class, "both": by_rate & by_class}[rule]
    flag = flag & (probs[rows, suggested] > p_given)  # never a row whose given label is the more probable
    order = np.lexsort((-probs[rows, suggested], p_given))  # self-confidence up, the suggestion's probability down
    flagged = order[flag[order]]
    return Found(thresholds, joint, flagged, suggested[flagged], float(wrong.sum()))


def audit(head: Head, sets: dict, taps: list[Tap], splittings: int, n_passes: int = DEFAULT_PASSES,
          rule: str = FILTERS[0], first_probs: dict | None = None) -> dict[str, tuple[Found, np.ndarray, np.ndarray,
                                                                                   list[str]]]:
    """Per prompt with a head: (confident learning's result, the out-of-fold probabilities it judged, the given
    labels, the labels) after `n_passes` passes, 1 or 2 (the module docstring). `first_probs`: the first pass's
    probabilities where already computed (qcls/fitting/threshold_fitting.py `head_probs`)."""
    from qcls.fitting.threshold_fitting import head_probs
    if n_passes not in PASSES:
        raise ValueError(f"{n_passes} passes: the audit makes {' or '.join(map(str, PASSES))}")
    probs = first_probs if first_probs is not None else head_probs(head, sets, taps, splittings)
    found = {name: confident_learning(p, given, rule) for name, (p, given, _) in probs.items()}
    if n_passes == 2:
        thresholds = {name: label_thresholds(p, given, found[name].flagged) for name, (p, given, _) in probs.items()}
        probs = head_probs(head, sets, taps, splittings, leave_out={name: f.flagged for name, f in found.items()})
        found = {name: confident_learning(p, given, rule, thresholds[name]) for name, (p, given, _) in probs.items()}
    return {name: (found[name], *probs[name]) for name in probs}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="qcls audit", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 description="Find probably wrong labels in a labelled file (JSONL, CSV or TSV, as "
                                             "`qcls calibrate --eval` reads): fit the head `qcls calibrate --method "
                                             "head` fits, and rank the rows whose given label its out-of-fold "
                                             "probabilities find unlikely (confident learning). key=value arguments "
                                             "are Hydra overrides.")
    ap.add_argument("--out", metavar="FILE.csv", help=f"the flagged rows (default {DEFAULT_OUT}, never overwritten; "
                    "a file named here is)")
    ap.add_argument("--json", action="store_true", help="also print one JSON object per flagged row on stdout")
    ap.add_argument("--filter", choices=FILTERS, default=FILTERS[0],
                    help=f"the flagging rule (default {FILTERS[0]}, chosen on the dev split: a row whose most "
                         "probable label among those over their thresholds is another, more probable than the given "
                         "one; prune_by_noise_rate, prune_by_class and both flag the estimated number of wrong labels "
                         "per cell or per label: see docs/evaluation.md)")
    ap.add_argument("--cv-splittings", type=int, default=DEFAULT_SPLITTINGS, metavar="R",
                    help=f"average each row's out-of-fold probabilities over R stratified splittings into the "
                         f"--nested-folds folds (default {DEFAULT_SPLITTINGS}; 1 = the fit's own splitting): less noise "
                         "in each row's probability")
    ap.add_argument("--passes", type=int, choices=PASSES, default=DEFAULT_PASSES,
                    help="2 (default, chosen on the shipped dev split's simulation): a second pass with held-out "
                         "heads fitted without the rows the first pass flags, against thresholds taken over the rows "
                         "it trusts (about twice the fitting time of 1); 1: one pass")
    ap.add_argument("items", nargs="*", metavar="LABELLED|OVERRIDE",
                    help="the labelled file (or dev / test: the shipped splits), then overrides")
    head_options.add(ap, "the head (as qcls calibrate --method head)", AUDIT_NESTED_FOLDS)
    return ap


def out_path(args: argparse.Namespace, labelled: Path) -> Path:
    """Where the CSV goes, refused before the model loads: an existing file the user did not name, the labelled
    file itself, or a name that is not .csv."""
    out = Path(args.out or DEFAULT_OUT)
    if out.suffix.lower() != ".csv":
        raise ValueError(f"--out {out}: the audit is a CSV file; name it FILE.csv")
    if out.exists() and out.resolve() == labelled.resolve():
        raise ValueError(f"--out {out} is the labelled file being audited; name another file")
    if args.out is None and out.exists():
        raise ValueError(f"{out} exists (an earlier audit?) and is not overwritten unless named: give --out {out} "
                         "to replace it, or --out OTHER.csv")
    return out


def labelled_path(value: str) -> Path:
    """dev / test (the eval group's splits) → the file it names; else the file, relative to the current directory."""
    from qcls.fitting.calibrate import split_path
    from qcls.eval.dataset import DatasetError
    from qcls.config.paths import candidates, find_file, group_options
    if value in group_options("eval"):
        return split_path(value)
    found = find_file(value)
    if found is None:
        raise DatasetError(f"{value}: no such file (looked at {', '.join(map(str, candidates(value)))}); give a "
                           "labelled JSONL, CSV or TSV file, or dev / test for the shipped splits")
    return found


def run(args: argparse.Namespace, labelled: str, overrides: list[str]) -> dict:
    from qcls.config.compose import compose
    from qcls.eval.dataset import load_eval_set
    if args.cv_splittings < 1:
        raise ValueError(f"--cv-splittings {args.cv_splittings}: give 1 or more splittings to average over")
    cfg = compose(overrides)
    path = labelled_path(labelled)
    data = load_eval_set(path, cfg.prompts)  # refused before the model loads
    out = out_path(args, path)
    fitted = head_options.fit(args, cfg, data)
    flagged, prompts = [], {}
    from qcls.fitting.threshold_fitting import head_probs
    first = head_probs(fitted.head, fitted.sets, fitted.taps, args.cv_splittings, outcome=fitted.nested)
    for name, (found, probs, given, labels) in audit(fitted.head, fitted.sets, fitted.taps, args.cv_splittings,
                                                     args.passes, args.filter, first).items():
        queries = [e.query for e, g in zip(data.examples, fitted.sets[name].gold) if g >= 0]
        ph = fitted.head.prompts[name]
        prompts[name] = {"rows": len(given), "flagged": len(found.flagged), "estimated_wrong": round(found.estimate, 1),
                         "read": f"{ph.read.kind}@{ph.read.layer}" if ph.read else "raw scores",
                         "cv_accuracy": ph.info.get("cv_accuracy"),
                         "thresholds": {lab: round(float(t), 4) for lab, t in zip(labels, found.thresholds)}}
        flagged += [{"query": queries[i], "prompt": name, "given": labels[given[i]], "suggested": labels[k],
                     "given_prob": round(float(probs[i, given[i]]), 4), "suggested_prob": round(float(probs[i, k]), 4)}
                    for i, k in zip(found.flagged, found.suggested)]
    flagged.sort(key=lambda r: (r["given_prob"], -r["suggested_prob"]))
    for rank, row in enumerate(flagged, start=1):
        row["rank"] = rank
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(flagged)
    return {"file": str(data.path), "out": str(out), "n_queries": len(data.examples), "folds": fitted.nested.outer_folds,
            "splittings": args.cv_splittings, "passes": args.passes, "filter": args.filter,
            "prompts": prompts, "flagged": flagged, "notes": fitted.notes}


def summary(res: dict) -> str:
    """stderr: per prompt its rows, flagged rows and estimated wrong labels, then the most doubtful rows."""
    head = ("prompt", "rows", "flagged", "estimated wrong", "head read", "CV accuracy")
    rows = [(p, str(v["rows"]), str(v["flagged"]), f"{v['estimated_wrong']:.0f}", v["read"],
             f"{v['cv_accuracy']:.3f}" if v["cv_accuracy"] is not None else "-") for p, v in res["prompts"].items()]
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    lines = [f"audit of {res['file']} ({res['n_queries']} queries; out-of-fold probabilities of "
             f"{res['folds']}-fold cross-validated heads, averaged over {res['splittings']} splittings; "
             f"rule {res['filter']}; {res['passes']} pass{'es' if res['passes'] > 1 else ''}):"]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head] + rows]
    for p in res["prompts"]:
        top = [r for r in res["flagged"] if r["prompt"] == p][:SHOWN]
        if top:
            lines.append(f"{p}, the most doubtful (rank: query: given p → suggested p):")
            lines += [f"  {r['rank']}: {r['query']!r}: {r['given']} {r['given_prob']:.3f} → {r['suggested']} "
                      f"{r['suggested_prob']:.3f}" for r in top]
    lines += [f"note: {n}" for n in res["notes"]]
    lines.append(f"wrote {res['out']} ({len(res['flagged'])} flagged rows, most doubtful first): candidates to read; "
                 "a flagged label may be right, and a confident disagreement may be a gap in the label definitions")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from qcls.config.overrides import split_args
    from qcls.eval.dataset import DatasetError
    ap = build_parser()
    args = ap.parse_intermixed_args(list(sys.argv[1:] if argv is None else argv))  # the file before options
    files, overrides = split_args(args.items)
    if len(files) != 1:
        ap.error(f"give one labelled file (then key=value overrides), got {files or 'none'}")
    try:
        res = run(args, files[0], overrides)
    except (ConfigError, DatasetError, ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"qcls audit: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        for row in res["flagged"]:
            print(json.dumps(row, ensure_ascii=False))
        sys.stdout.flush()
    print(summary(res), file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
