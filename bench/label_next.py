"""Label-next against random picking, simulated on the shipped splits (docs/evaluation.md, "Choosing what to label").

The dev split is the pool whose gold labels are revealed when a query is picked, the test split scores. Per seed:
the same 20 random dev queries start both arms; each round adds 10 (random, or `qcls label-next`'s choice:
qcls/fitting/label_next.py with its defaults), up to 100, and refits. Each prompt's head is fitted as the sweep's
learning curve fits it (qcls/fitting/heads.py: learning_curve): the layer, read and L2 strength of the model's
shipped head (chosen by `qcls calibrate --method head` on the whole dev split), a label not yet labelled never
predicted. (Calibrate itself refuses fewer than 3 queries of a label: with 6 `girl` queries among 151, random
picking rarely has them before 100, and the curves would only say when both arms reach 3.) States are read once.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from bench import common as C
from qcls.classifier import Classifier
from qcls.config.compose import compose
from qcls.fitting import heads as H
from qcls.fitting import label_next as LN
from qcls.fitting.calibrate import split_path
from qcls.eval.dataset import load_eval_set
from qcls.fitting.head_fitting import read_set
from qcls.eval.metrics import softmax
from qcls.heads.head import FINAL, Read
from qcls.heads.startup import choose as choose_heads

LLM_STATE = Read(FINAL, "position")  # a model without a shipped head (tiny): the final state


def setup(model: str):
    """(per prompt the read, dev sets, test sets, taps) with the states of both splits read once."""
    over = C.checkpoint_overrides("tiny") + ["engine.warmup_requests=1"] if model == "tiny" else [f"model={model}"]
    cfg = compose(over)
    shipped = choose_heads(cfg).head
    got = {p.name: shipped.prompts[p.name] for p in cfg.prompts if shipped and p.name in shipped.prompts}
    reads = {p.name: (got[p.name].read, got[p.name].info["C"]) if p.name in got else (LLM_STATE, 1.0)
             for p in cfg.prompts}
    taps = H.taps_of([r for r, _ in reads.values()])
    clf = Classifier(cfg.model_copy(update={"calibration": None}), taps=taps)
    dev, test = (read_set(clf, load_eval_set(split_path(s), cfg.prompts)) for s in ("dev", "test"))
    return reads, dev, test, clf.engine.taps, cfg.model.name


def fit(ss, rows, read, taps):  # the prompt's head on the labelled rows, at the shipped head's read and C
    return H.fit_affine(H.features(ss.states[rows], taps, read[0], None), ss.gold[rows], len(ss.labels), read[1])


def probs(ss, head, rows, read, taps):
    return softmax(H.features(ss.states[rows], taps, read[0], None) @ head.weights.T + head.bias)


def next_batch(dev, heads, reads, taps, labelled, k):
    """`qcls label-next`'s k picks among the dev rows not labelled."""
    pool = np.setdiff1d(np.arange(len(next(iter(dev.values())).gold)), labelled)
    rows = np.concatenate([pool, labelled])
    states = LN.unit_states([H.features(ss.states[rows], taps, reads[p][0], None) for p, ss in dev.items()])
    cand = LN.Candidates([str(i) for i in pool], np.ones(len(pool)),
                         {p: probs(ss, heads[p], pool, reads[p], taps) for p, ss in dev.items()},
                         {p: ss.labels for p, ss in dev.items()}, {}, states[:len(pool)])
    return pool[[pk.index for pk in LN.choose(cand, k, states[len(pool):])]]


def simulate(reads, dev, test, taps, seeds, start, step, until):
    """acc[arm][prompt][size] = per seed test accuracy."""
    sizes = list(range(start, until + 1, step))
    acc = {a: {p: {n: [] for n in sizes} for p in dev} for a in ("random", "label-next")}
    n_dev = len(next(iter(dev.values())).gold)
    for seed in range(seeds):
        first = np.random.default_rng(seed).choice(n_dev, start, replace=False)
        for arm in acc:
            labelled, arm_rng = first.copy(), np.random.default_rng([seed, 1])
            for n in sizes:
                heads = {p: fit(ss, labelled, reads[p], taps) for p, ss in dev.items()}
                for p, ts in test.items():
                    rows = np.flatnonzero(ts.gold >= 0)
                    pred = probs(ts, heads[p], rows, reads[p], taps).argmax(1)
                    acc[arm][p][n].append(float(np.mean(pred == ts.gold[rows])))
                if n == until:
                    break
                if arm == "random":
                    new = arm_rng.choice(np.setdiff1d(np.arange(n_dev), labelled), step, replace=False)
                else:
                    new = next_batch(dev, heads, reads, taps, labelled, step)
                labelled = np.concatenate([labelled, new])
    return sizes, acc


def tables(sizes, acc, seeds, until) -> tuple[str, dict]:
    lines, goal = [], {}
    for p in acc["random"]:
        lines += [f"\n{p}: mean test accuracy over {seeds} seeds (± sd)\n",
                  "| labelled | random | label-next |", "|---|---|---|"]
        for n in sizes:
            cell = [f"{np.mean(acc[a][p][n]):.3f} ± {np.std(acc[a][p][n]):.3f}" for a in ("random", "label-next")]
            lines.append(f"| {n} | {cell[0]} | {cell[1]} |")
        target = float(np.mean(acc["random"][p][until]))
        hit = next((n for n in sizes if np.mean(acc["label-next"][p][n]) >= target), None)
        mid = min(60, until)
        at60 = float(np.mean(acc["label-next"][p][mid]))
        goal[p] = {"random_at_max": round(target, 4), "label_next_reaches_it_at": hit,
                   "label_next_at_60": round(at60, 4), "met": hit is not None and hit <= 60}
        lines.append(f"\nrandom at {until}: {target:.3f}; label-next reaches it at "
                     f"{hit if hit else f'no size up to {until}'}; at {mid}: {at60:.3f} ({at60 - target:+.3f}); "
                     f"goal (≤ 60): {'met' if goal[p]['met'] else 'not met'}")
    return "\n".join(lines) + "\n", goal


def plot(sizes, acc, until, path: Path) -> None:
    from qcls.sweep.plots import _pyplot, saved
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(acc["random"]), figsize=(5 * len(acc["random"]), 4), squeeze=False)
    for ax, p in zip(axes[0], acc["random"]):
        for arm, color in (("random", "tab:gray"), ("label-next", "tab:blue")):
            m = np.array([np.mean(acc[arm][p][n]) for n in sizes])
            sd = np.array([np.std(acc[arm][p][n]) for n in sizes])
            ax.plot(sizes, m, marker="o", color=color, label=arm)
            ax.fill_between(sizes, m - sd, m + sd, color=color, alpha=0.15)
        ax.axhline(np.mean(acc["random"][p][until]), ls="--", color="tab:gray", lw=0.8, label=f"random at {until}")
        ax.set(title=p, xlabel="labelled queries", ylabel="test accuracy")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    saved(fig, path)


def main() -> None:
    ap = C.parser(__doc__)
    ap.add_argument("--model", default="gemma3_demo", help="a model config (its shipped head's reads), or tiny")
    for opt, default in (("--seeds", 5), ("--start", 20), ("--step", 10), ("--until", 100)):
        ap.add_argument(opt, type=int, default=default)
    ap.add_argument("--plot", type=Path, help="write the learning curves here (PNG)")
    args = ap.parse_args()
    reads, dev, test, taps, name = setup(args.model)
    sizes, acc = simulate(reads, dev, test, taps, args.seeds, args.start, args.step, args.until)
    text, goal = tables(sizes, acc, args.seeds, args.until)
    shown = ", ".join(f"{p} {r.kind}@{r.layer} C={c:.3g}" for p, (r, c) in reads.items())
    C.report(C.header(f"label-next against random: {name}, shipped dev split as the pool, test split scored",
                      f"{name}, reads {shown}, {args.seeds} seeds, {args.start} + {args.step} a round up to "
                      f"{args.until}") + text, args.no_append, "label_next", {"acc": acc, "goal": goal})
    if args.plot:
        plot(sizes, acc, args.until, args.plot)


if __name__ == "__main__":
    main()
