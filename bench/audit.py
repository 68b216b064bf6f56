"""How well `qcls audit` finds wrong labels: 10 % of each prompt's labels in the dev split changed at random to
another label, and the rows the audit flags compared with the changed ones (precision, recall), per seed.

    python bench/audit.py                                 # gemma3_demo, the reads of its shipped head, 5 seeds
    python bench/audit.py --tiny --seeds 1 --no-append    # a tiny random-weight model (the smoke run)

The states of the dev split are read once, at the reads the model's shipped head uses (the tiny model: the read
position after layer 1). Per seed and prompt the head is refitted on the changed labels at that read (its L2
strength chosen by the same cross-validation: qcls/eval/head_fitting.py) and audited on its out-of-fold
probabilities (qcls/eval/audit.py). A draw that would leave a label with fewer examples than the folds is drawn
again (a split the audit refuses). Beside: what the audit flags on the labels as they are.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import common as C  # noqa: E402
from qcls.classifier import Classifier  # noqa: E402
from qcls.config.compose import compose  # noqa: E402
from qcls.eval import head_fitting  # noqa: E402
from qcls.eval.audit import confident_learning  # noqa: E402
from qcls.eval.calibrate import split_path  # noqa: E402
from qcls.eval.dataset import load_eval_set  # noqa: E402
from qcls.eval.heads import FOLDS, taps_of  # noqa: E402
from qcls.eval.threshold_fitting import head_probs  # noqa: E402
from qcls.heads.head import Read  # noqa: E402

GOAL = 0.6


def setup(tiny: bool) -> tuple[list[str], dict[str, Read]]:
    """(overrides, per prompt the read audited)."""
    if tiny:
        from qcls.testing.tiny_models import make_tiny_model_dir, tiny_byte_tokenizer
        d = make_tiny_model_dir(Path(tempfile.mkdtemp(prefix="qcls_bench_")) / "tiny", "qwen3", tiny_byte_tokenizer(),
                                seed=1)
        over = ["prompts=default", "model.source=local", f"model.path={d}", "model.name=tiny", "model.head=null",
                "engine.query_buckets=[16,32]", "max_query_tokens=32", "engine.warmup_requests=1"]
        return over, {p.name: Read(1, "position") for p in compose(over).prompts}
    from qcls.heads import files
    from qcls.heads.startup import resolve_path
    over = ["model=gemma3_demo"]
    head = files.load(resolve_path(compose(over).model.head))
    return over, {name: ph.read for name, ph in head.prompts.items()}


def change(gold: np.ndarray, n_labels: int, share: float, folds: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(labels with `share` of them changed to another label at random, the rows changed)."""
    while True:
        rows = rng.choice(len(gold), size=round(share * len(gold)), replace=False)
        given = gold.copy()
        given[rows] = (gold[rows] + rng.integers(1, n_labels, len(rows))) % n_labels
        if np.bincount(given, minlength=n_labels).min() >= folds:
            return given, rows


def audit(clf, ss, taps, read: Read, given: np.ndarray, name: str, folds: int):
    """The audit's flagged rows and estimate for one prompt whose labels are `given`."""
    one = head_fitting.StateSet(ss.labels, ss.states[ss.gold >= 0], ss.scores[ss.gold >= 0], given)
    head = head_fitting.fit(clf, {name: one}, taps, [read], False, folds, "dev split, labels changed")
    probs, g, _ = head_probs(head, {name: one}, taps)[name]
    return confident_learning(probs, g)


def spread(x: np.ndarray) -> str:
    return f"{x.mean():.2f} ({x.min():.2f}–{x.max():.2f})"


def main() -> None:
    ap = C.parser(__doc__)
    ap.add_argument("--tiny", action="store_true", help="a tiny random-weight model instead of gemma3_demo")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--share", type=float, default=0.1, help="the share of each prompt's labels changed")
    ap.add_argument("--cv-folds", type=int, default=FOLDS, help=f"the audit's folds (default {FOLDS}, as qcls audit)")
    args = ap.parse_args()
    over, reads = setup(args.tiny)
    cfg = compose(over + ["calibration=null"])
    data = load_eval_set(split_path("dev"), cfg.prompts)
    taps = taps_of(list(reads.values()))
    clf = Classifier(cfg, taps=taps)
    sets = head_fitting.read_set(clf, data)
    rows, per = [], {}
    for j, (name, read) in enumerate(reads.items()):
        ss = sets[name]
        gold = ss.gold[ss.gold >= 0]
        clean = audit(clf, ss, taps, read, gold, name, args.cv_folds)
        got = []
        for seed in range(args.seeds):
            rng = np.random.default_rng([seed, j])
            given, changed = change(gold, len(ss.labels), args.share, args.cv_folds, rng)
            found = audit(clf, ss, taps, read, given, name, args.cv_folds)
            hit = len(set(found.flagged) & set(changed))
            got.append((hit / max(1, len(found.flagged)), hit / len(changed), len(found.flagged), found.estimate,
                        len(changed)))
        p, r, f, e, k = (np.array(x, dtype=float) for x in zip(*got))
        met = "yes" if p.mean() >= GOAL and r.mean() >= GOAL else "**no**"
        per[name] = {"read": f"{read.kind}@{read.layer}", "rows": len(gold), "precision": p.tolist(),
                     "recall": r.tolist(), "flagged": f.tolist(), "estimate": e.tolist(), "changed": k.tolist(),
                     "flagged_as_labelled": len(clean.flagged), "estimate_as_labelled": clean.estimate}
        rows.append(f"| {name} | {read.kind}@{read.layer} | {len(gold)} | {k.mean():.0f} | {f.mean():.1f} | "
                    f"{spread(p)} | {spread(r)} | {met} | {e.mean():.1f} | {len(clean.flagged)} / "
                    f"{clean.estimate:.1f} |")
    model = "tiny random-weight qwen3" if args.tiny else "gemma3_demo"
    text = (C.header(f"Audit: wrong labels found in the dev split ({model})",
                     f"{model}, prompts {list(reads)}, dev split; per prompt {args.share:.0%} of the labels changed at "
                     f"random to another label, {args.seeds} seeds; heads refitted at the shipped heads' reads, "
                     f"{args.cv_folds}-fold out-of-fold probabilities, confident learning (qcls/eval/audit.py)")
            + "| prompt | read | rows | changed | flagged (mean) | precision, mean (min–max) | recall, mean "
            f"(min–max) | both ≥ {GOAL} | estimated wrong (mean) | labels as given: flagged / estimated |\n"
            + "|---" * 10 + "|\n" + "\n".join(rows) + "\n")
    C.report(text, args.no_append, "audit", per)


if __name__ == "__main__":
    main()
