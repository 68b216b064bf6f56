"""How well `qcls audit` finds wrong labels: 10 % of each prompt's labels changed at random to another label, the
flagged rows against the changed ones (precision, recall) per seed; the rule and the number of passes chosen on the
dev split (every pair compared), reported on the test split (qcls audit's defaults).

    python bench/audit.py --cache /tmp/qcls_audit [--split test]   # gemma3_demo at its shipped head's reads
    python bench/audit.py --tiny --seeds 1 --no-append             # a tiny random-weight model (the smoke run)

States are read once per --cache (the tiny model: position after layer 1). Per seed and prompt the head is refitted
on the changed labels at its read (L2 strength by the same cross-validation) and audited on its out-of-fold
probabilities averaged over qcls audit's splittings, in 1 or 2 passes (qcls/fitting/audit.py); a draw leaving a
label fewer examples than the folds is drawn again."""
from __future__ import annotations

import pickle
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import common as C  # noqa: E402
from qcls.config.compose import compose  # noqa: E402
from qcls.fitting import audit as A  # noqa: E402
from qcls.fitting import heads as H  # noqa: E402
from qcls.fitting.calibrate import split_path  # noqa: E402
from qcls.eval.dataset import load_eval_set  # noqa: E402
from qcls.fitting.head_fitting import StateSet, read_set  # noqa: E402
from qcls.fitting.threshold_fitting import head_probs  # noqa: E402
from qcls.heads.head import Head, Read  # noqa: E402

GOAL = 0.6


def setup(tiny: bool) -> tuple[list[str], dict[str, Read], str]:
    """(overrides, per prompt the read audited, the model's name)."""
    if tiny:
        from qcls.testing.tiny_models import make_tiny_model_dir, tiny_byte_tokenizer
        d = make_tiny_model_dir(Path(tempfile.mkdtemp()) / "tiny", "qwen3", tiny_byte_tokenizer(), seed=1)
        over = ["prompts=default", "model.source=local", f"model.path={d}", "model.name=tiny", "model.head=null",
                "engine.query_buckets=[16,32]", "max_query_tokens=32", "engine.warmup_requests=1", "backend=fp16"]
        return over, {p.name: Read(1, "position") for p in compose(over).prompts}, "tiny"
    from qcls.heads import files
    from qcls.heads.startup import resolve_path
    over = ["model=gemma3_demo", "backend=fp16"]
    head = files.load(resolve_path(compose(over).model.head))
    return over, {name: ph.read for name, ph in head.prompts.items()}, "gemma3_demo"


def states(over: list[str], reads: dict[str, Read], taps, split: str, cache: str | None, model: str) -> dict:
    """Per prompt the split's states at the reads (qcls/fitting/head_fitting.py StateSets), read once per cache."""
    key = f"{model}_{split}_" + "_".join(f"{r.kind}{r.layer}" for r in reads.values())
    path = Path(cache) / f"audit_states_{key}.pkl" if cache else None
    if path and path.is_file():
        return pickle.loads(path.read_bytes())
    from qcls.classifier import Classifier
    cfg = compose(over + ["calibration=null"])
    sets = read_set(Classifier(cfg, taps=taps), load_eval_set(split_path(split), cfg.prompts))
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pickle.dumps(sets))
    return sets


def change(gold: np.ndarray, n_labels: int, share: float, folds: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(labels with `share` of them changed to another label at random, the rows changed)."""
    while True:
        rows = rng.choice(len(gold), size=round(share * len(gold)), replace=False)
        given = gold.copy()
        given[rows] = (gold[rows] + rng.integers(1, n_labels, len(rows))) % n_labels
        if np.bincount(given, minlength=n_labels).min() >= folds:
            return given, rows


def audits(ss, taps, read: Read, given: np.ndarray, folds: int, name: str, rules: list[tuple[str, int]]) -> dict:
    """Per (rule, passes), the audit (qcls/fitting/audit.py Found) of the head refitted on `given`."""
    states, scores, _ = ss.labelled()
    head = Head({name: H.fit_prompt(states, taps, scores, given, ss.labels, [read], False, folds=folds)}, "head", {})
    sets = {name: StateSet(ss.labels, states, scores, given)}
    first = head_probs(head, sets, taps, A.DEFAULT_SPLITTINGS)
    return {(rule, n): A.audit(head, sets, taps, A.DEFAULT_SPLITTINGS, n, rule, first)[name][0] for rule, n in rules}


def spread(x: np.ndarray) -> str:
    return f"{x.mean():.2f} ({x.min():.2f}–{x.max():.2f})"


def main() -> None:
    ap = C.parser(__doc__)
    ap.add_argument("--split", choices=["dev", "test"], default="dev",
                    help="dev: every rule compared (the split that chooses); test: the audit's default (reported)")
    ap.add_argument("--tiny", action="store_true", help="a tiny random-weight model instead of gemma3_demo")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--share", type=float, default=0.1, help="the share of each prompt's labels changed")
    ap.add_argument("--cv-folds", type=int, default=H.FOLDS, help=f"the folds (default {H.FOLDS}, as qcls audit)")
    ap.add_argument("--cache", metavar="DIR", help="keep the split's states in DIR between runs")
    args = ap.parse_args()
    over, reads, model = setup(args.tiny)
    taps = H.taps_of(list(reads.values()))
    sets = states(over, reads, taps, args.split, args.cache, model)
    rules = ([(f, n) for n in A.PASSES for f in A.FILTERS] if args.split == "dev" else  # (rule, passes)
             [(A.FILTERS[0], A.DEFAULT_PASSES)])
    lines, per = [], {}
    for j, (name, read) in enumerate(reads.items()):
        ss, gold = sets[name], sets[name].labelled()[2]
        draws = [(gold, [])] + [change(gold, len(ss.labels), args.share, args.cv_folds, np.random.default_rng([s, j]))
                                for s in range(args.seeds)]  # first the labels as given
        seen = [audits(ss, taps, read, g, args.cv_folds, name, rules) for g, _ in draws]
        for rule, r in rules:
            found = [a[rule, r] for a in seen]
            hit = np.array([len(set(f.flagged) & set(c)) for f, (_, c) in zip(found[1:], draws[1:])])
            k, f = len(draws[1][1]), np.array([len(f.flagged) for f in found[1:]])
            p, rc, e = hit / np.maximum(f, 1), hit / k, np.array([f.estimate for f in found[1:]])
            per[f"{rule} {r} {name}"] = {"precision": p.tolist(), "recall": rc.tolist(), "flagged": f.tolist()}
            met = "yes" if p.mean() >= GOAL and rc.mean() >= GOAL else "**no**"
            lines.append(f"| {rule} | {r} | {name} | {len(gold)} | {k} | {f.mean():.1f} | {spread(p)} | {spread(rc)} "
                         f"| {met} | {e.mean():.1f} | {len(found[0].flagged)} / {found[0].estimate:.1f} |")
    shown = ", ".join(f"{n} {r.kind}@{r.layer}" for n, r in reads.items())
    role = "every rule compared: this split chooses" if args.split == "dev" else "the audit's rule: this split reports"
    text = (C.header(f"Audit: wrong labels found in the {args.split} split ({model})",
                     f"{model}, {args.split} split ({role}); per prompt {args.share:.0%} of the labels changed at "
                     f"random to another label, {args.seeds} seeds; heads refitted at the shipped reads ({shown}), "
                     f"{args.cv_folds}-fold out-of-fold probabilities averaged over {A.DEFAULT_SPLITTINGS} CV "
                     "splittings, in 1 or 2 passes; rules: qcls/fitting/audit.py")
            + "| rule | passes | prompt | rows | changed | flagged (mean) | precision, mean (min–max) "
            f"| recall, mean (min–max) | both ≥ {GOAL} | estimated wrong (mean) | as given: flagged / estimated |\n"
            + "|---" * 11 + "|\n" + "\n".join(lines) + "\n")
    C.report(text, args.no_append, "audit", per)


if __name__ == "__main__":
    main()
