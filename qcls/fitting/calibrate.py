"""`qcls calibrate`: fit a per-prompt calibration or learned head on a labelled split and write the file that
the `calibration` config option loads (docs/design.md §9–10; qcls/fitting/calibration.py and qcls/fitting/heads.py do
the math)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from qcls.config.compose import ConfigError
from qcls.fitting import head_options

EPILOG = """examples:
  qcls calibrate                                   # the demo model, prompts=default, scoring=trie, dev split
  qcls calibrate prompts=ecommerce8 scoring=exact --method temperature
  qcls calibrate --eval /data/my_dev.jsonl --out calibration/mine.yaml model=qwen3_4b model.source=local model.path=/m
  qcls calibrate --method contextual               # bias = -log p(label | "N/A", "[MASK]"), T = 1
  qcls calibrate --method head                     # a learned head on the hidden state (layer/read by CV)
  qcls calibrate --method head --layer-rule best   # each prompt's most accurate read, whatever the depth costs
  qcls calibrate --method head --max-layer 9       # no read after layer 9: at most 9 layers run per forward
  qcls calibrate --method head --layer 12 --read both --with-scores prompts=ecommerce8
  qcls calibrate --method head --target-precision 0.95 --target-precision audience=0.9   # + abstention thresholds
  qcls calibrate --thresholds-for calibration/mine.yaml --target-coverage 0.8 --out calibration/mine_t.yaml

Methods: temperature_bias (default: per prompt a temperature T and per-label biases b minimising the NLL
of the gold labels; calibrated score = (score + b) / T), temperature (T only), bias (b only), contextual
(Zhao et al. 2021: b = -log p_cf measured on content-free inputs, T = 1; the split is only used to print
the before/after metrics), head (per prompt a multinomial logistic regression on the hidden state the engine
reads: --layer final or N = the residual stream after N layers, --read position | query_mean | both; auto
(the default) tries ~15 layers and final / every kind, cross-validated; the forward stops after the deepest
layer any prompt reads, so the depth is chosen for the prompt set: --layer-rule one-se (default) = the
shallowest exit at which every prompt's CV log-loss is within one standard error (over the folds) of its own
best, best = per prompt the lowest CV log-loss whatever it costs; --max-layer N caps the depth; the table of
candidate exits (per prompt CV accuracy, log-loss ± SE, cost = layers run / N) is printed and stored in the
file's meta.depth; the L2 strength is chosen by --cv-folds-fold cross-validation on the split; --with-scores
appends the raw label scores as features (the forward then runs every layer); the weights go into FILE.safetensors beside FILE.yaml). A calibration holds for the model,
prompts and scoring strategy it was fitted under; a head for the model's weights, prompt templates and label
sets (refused at start-up otherwise). The metrics printed are on the split it was fitted on (optimistic;
a head's CV accuracy is held out within the split); `qcls sweep -m ... eval=test` reports held-out numbers.
Beside them: the majority class and a character n-gram TF-IDF + logistic regression per prompt, cross-validated
on the split with the head's folds (qcls/fitting/baseline.py).
Thresholds (--target-precision, --target-coverage): per prompt the least probability the winner needs, else
the prompt abstains (no label, or --fallback); chosen on the split's nested out-of-fold head probabilities (a
calibration's in-sample ones) as the lowest threshold whose answered queries' precision has a one-sided
Clopper-Pearson lower bound at --confidence (default 0.9) >= the target (the most coverage the split
certifies), written into the file beside the prompt's head with the bound, confidence and n
(qcls/heads/thresholds.py). A head's CV accuracy is nested: read, L2 strength and exit chosen again inside each
outer fold (qcls/fitting/nested.py).
Load the file with the override calibration=FILE. See docs/evaluation.md."""


def build_parser() -> argparse.ArgumentParser:
    from qcls.heads.files import METHODS
    ap = argparse.ArgumentParser(prog="qcls calibrate", epilog=EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 description="Fit per-prompt calibration on a gold-labelled split and write it "
                                             "as YAML; key=value arguments are Hydra overrides.")
    ap.add_argument("--eval", default="dev", metavar="dev|test|PATH",
                    help="a split of conf/eval/ (default dev) or a JSONL, CSV or TSV file")
    ap.add_argument("--method", default="temperature_bias", choices=METHODS)
    ap.add_argument("--out", metavar="FILE.yaml",
                    help="default: calibration/<model>_<prompts>_<strategy>.yaml under the current directory")
    ap.add_argument("--limit", type=int, metavar="N", help="use the first N queries of the split")
    ap.add_argument("--append", action="store_true", help="head: add the heads to --out's (a file for several "
                    "prompt sets of one model), replacing heads fitted under the same templates")
    ap.add_argument("--target-precision", action="append", metavar="P|PROMPT=P",
                    help="also fit per prompt an abstention threshold: the lowest whose answered queries' precision "
                         "on the split's held-out (nested out-of-fold for a head) probabilities is certified at "
                         "--confidence to reach this, so the most are answered; 0.95 for every prompt, category=0.9 for one (repeat or comma-separate). A target "
                         "the split cannot reach is reported and no threshold is written for that prompt")
    ap.add_argument("--confidence", type=float, default=0.9, metavar="C",
                    help="the confidence a target precision is kept with (default 0.9): the threshold chosen is the "
                         "lowest whose answered queries' precision has a one-sided Clopper–Pearson lower bound at C "
                         "≥ the target; the head file records the bound, C and n")
    ap.add_argument("--target-coverage", action="append", metavar="C|PROMPT=C",
                    help="instead: the highest threshold that still answers this share of the split's queries")
    ap.add_argument("--fallback", metavar="LABEL", help="the label an abstaining prompt reports (default: none; "
                    "the result is marked abstained either way)")
    ap.add_argument("--thresholds-for", metavar="FILE.yaml", help="fit only thresholds, for this existing head "
                    "file (its heads unchanged; written to --out, default the file itself)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("items", nargs="*", metavar="OVERRIDE")
    head_options.add(ap, "learned head (--method head; --cv-folds also sets the baseline's folds)")
    return ap


def split_path(value: str) -> Path:
    """`dev` / `test` (an option of the eval group) → the file it names; anything else is a path."""
    from qcls.eval.spec import named_split, resolve_path
    from qcls.config.paths import group_options
    if value in group_options("eval"):
        return resolve_path(named_split(value).path, f"eval/{value}.yaml path")
    return resolve_path(value, "--eval")


def prompts_group(cfg) -> str | None:
    """The prompts group option (a user's config folder first, then the shipped ones) whose prompts are exactly
    the config's, if one is."""
    from omegaconf import OmegaConf

    from qcls.config import PromptSpec
    from qcls.config.paths import group_options
    for f in group_options("prompts").values():
        try:
            listed = OmegaConf.to_container(OmegaConf.load(f), resolve=True).get("prompts", [])
            if [PromptSpec.model_validate(p) for p in listed] == list(cfg.prompts):
                return f.stem
        except Exception:  # a file that does not parse is simply not this config's group
            continue
    return None


def default_out(cfg, method: str) -> Path:
    prompts = prompts_group(cfg) or "-".join(p.name for p in cfg.prompts)[:60]
    if method == "head":  # a head on the state alone does not depend on the scoring strategy
        return Path("calibration") / f"{cfg.model.name}_{prompts}_head.yaml"
    tail = "" if method == "temperature_bias" else f"_{method}"
    return Path("calibration") / f"{cfg.model.name}_{prompts}_{cfg.strategy}{tail}.yaml"


def run(args: argparse.Namespace, overrides: list[str]) -> dict[str, Any]:
    from qcls.classifier import Classifier
    from qcls.config.compose import compose
    from qcls.fitting import baseline, calibrated_metrics
    from qcls.fitting.calibration import contextual
    from qcls.eval.dataset import load_eval_set
    from qcls.eval.scores import by_prompt, classify_set
    from qcls.config.paths import shown

    cfg = compose(overrides)
    data = load_eval_set(split_path(args.eval), cfg.prompts, args.limit)  # refused before the model loads
    from qcls.fitting.threshold_fitting import targets as threshold_targets
    targets = threshold_targets(args, cfg)
    head_options.folds(args)  # a fold count below 2 is refused before the model loads
    if args.thresholds_for:
        from qcls.fitting.threshold_fitting import for_file
        return for_file(args, cfg, data, targets)
    out = Path(args.out) if args.out else default_out(cfg, args.method)
    if args.method == "head":
        res = fit_head(args, cfg, data, out, targets)
        res["baseline"] = baseline.block(cfg.prompts, data, None, head_options.folds(args)[0])  # the head's
        return res
    clf = Classifier(cfg.model_copy(update={"calibration": None}))  # fitted on the LLM's own label scores
    results, _ = classify_set(clf, data)
    per = by_prompt(results, data)
    if args.method == "contextual":
        cal = contextual(clf)
    else:
        meta = {"strategy": cfg.strategy, "model": cfg.model.name, "fitted_on": shown(data.path)}
        cal = calibrated_metrics.fit_on_split(per, args.method, meta)
    fits = None
    if targets:  # a calibration has a temperature and a bias per label: its in-sample probabilities
        from qcls.eval import metrics
        from qcls.fitting import threshold_fitting
        probs = {p: (metrics.softmax(calibrated_metrics.apply(cal, p, ps.labelled()[0])), ps.labelled()[1],
                     ps.labels) for p, ps in per.items() if len(ps.labelled()[1])}
        fits = threshold_fitting.fit(cal, probs, *targets, args.fallback, "in-sample (calibration)", args.confidence)
    out.parent.mkdir(parents=True, exist_ok=True)
    cal.save(out)
    cols = calibrated_metrics.fitted_columns(per, cal, f"{args.method} on {data.path}")
    try:
        shown = out.resolve().relative_to(Path.cwd())
    except ValueError:
        shown = out.resolve()
    return {"file": str(out.resolve()), "override": f"calibration={shown}", "method": cal.method,
            "split": str(data.path), "n_queries": len(data.examples), "strategy": cfg.strategy,
            "model": cfg.model.name, "per_prompt": cols["per_prompt"], "mean": cols["mean"],
            "baseline": baseline.block(cfg.prompts, data, None, head_options.folds(args)[0]),
            "calibration": {p: {"temperature": pc.temperature, "bias": dict(zip(pc.labels, pc.bias))}
                            for p, pc in cal.prompts.items()}, "thresholds": fits}


def fit_head(args: argparse.Namespace, cfg, data, out: Path, targets=None) -> dict[str, Any]:
    from qcls.fitting import calibrated_metrics
    from qcls.fitting import head_fitting
    from qcls.eval.scores import PromptScores
    from qcls.heads import files

    fitted = head_options.fit(args, cfg, data)
    head, sets, taps, notes = fitted.head, fitted.sets, fitted.taps, fitted.notes
    depth = head.meta["depth"]
    fits = None
    if targets:
        from qcls.fitting import threshold_fitting
        probs = threshold_fitting.head_probs(head, sets, taps, outcome=fitted.nested)
        fits = threshold_fitting.fit(head, probs, *targets, args.fallback, "nested out-of-fold", args.confidence)
    if args.append and out.is_file():
        old = files.load(out)
        if (old.meta.get("fingerprint") or {}) != head.meta["fingerprint"]:
            raise files.CalibrationError(f"--append: {out} holds heads of another model or weights "
                                         f"({old.meta.get('model')!r}); write to another --out")
        head = old.merged_with(head)
    out.parent.mkdir(parents=True, exist_ok=True)
    files.save(head, out)
    per = {name: PromptScores(name, ss.labels, ss.scores, np.zeros(len(ss.labels)), ss.gold)
           for name, ss in sets.items()}
    logits = head_fitting.head_scores(head, sets, taps)
    cols = calibrated_metrics.columns(per, logits, f"head on {data.path}", "head")
    try:
        shown = out.resolve().relative_to(Path.cwd())
    except ValueError:
        shown = out.resolve()
    return {"file": str(out.resolve()), "weights": str(out.with_suffix(".safetensors").resolve()),
            "override": f"calibration={shown}", "method": "head", "split": str(data.path),
            "n_queries": len(data.examples), "strategy": cfg.strategy, "model": cfg.model.name,
            "per_prompt": cols["per_prompt"], "mean": cols["mean"], "notes": notes, "thresholds": fits,
            "depth": depth,
            "heads": {p: {"read": ph.read.as_dict() if ph.read else None, "scores": ph.score_weights is not None,
                          **{k: v for k, v in ph.info.items() if k in ("n", "C", "cv_folds", "nested_folds",
                                                                        "cv_accuracy", "cv_log_loss",
                                                                        "selection_cv_accuracy")}}
                      for p, ph in head.prompts.items()}}


def _threshold_lines(res: dict[str, Any]) -> list[str]:
    from qcls.fitting.threshold_fitting import lines
    return lines(res)


def format_table(res: dict[str, Any]) -> str:
    def pair(before: dict, after: dict, key: str) -> str:
        if before.get(key) is None:
            return "-"
        return f"{before[key]:.3f} → {after[key]:.3f}"
    if res.get("thresholds_only"):
        return "\n".join(_threshold_lines(res) + [f"wrote {res['file']}", f"use it with the override: "
                                                                           f"{res['override']}"])
    if res["method"] == "head":
        return _head_table(res)
    rows = [(p, str(v["raw"].get("n", 0)), pair(v["raw"], v["calibrated"], "nll"),
             pair(v["raw"], v["calibrated"], "accuracy"), pair(v["raw"], v["calibrated"], "ece"))
            for p, v in res["per_prompt"].items()]
    rows.append(("mean", "", pair(res["mean"]["raw"], res["mean"]["calibrated"], "nll"),
                 pair(res["mean"]["raw"], res["mean"]["calibrated"], "accuracy"),
                 pair(res["mean"]["raw"], res["mean"]["calibrated"], "ece")))
    head = ("prompt", "n", "NLL before → after", "accuracy before → after", "ECE before → after")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    lines = [f"calibration {res['method']} of {res['model']} (scoring={res['strategy']}) on {res['split']} "
             f"({res['n_queries']} queries; metrics on this same split):"]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head] + rows]
    lines += _baseline_lines(res)
    lines += _threshold_lines(res)
    lines += [f"wrote {res['file']}", f"use it with the override: {res['override']}"]
    return "\n".join(lines)


def _baseline_lines(res: dict[str, Any], llm: dict[str, float] | None = None, name: str = "") -> list[str]:
    from qcls.fitting import baseline
    return baseline.table(res["baseline"], llm, name) if res.get("baseline") else []


def _head_table(res: dict[str, Any]) -> str:
    """Per prompt the read chosen, the L2 strength and the cross-validated accuracy (held out within the split),
    beside the raw scores' accuracy on the split; then the depth table (qcls/fitting/head_depth.py)."""
    from qcls.fitting import head_depth
    from qcls.heads.bounds import wilson
    head = ("prompt", "n", "read", "C", "accuracy: raw scores", "head (nested CV) [95 %]")
    rows = []
    for p, h in res["heads"].items():
        read = "raw scores only" if h["read"] is None else f"{h['read']['kind']} @ layer {h['read']['layer']}"
        lo, hi = wilson(int(round(h["cv_accuracy"] * h["n"])), h["n"])
        rows.append((p, str(h["n"]), read + (" + raw scores" if h["scores"] else ""), f"{h['C']:.3g}",
                     f"{res['per_prompt'][p]['raw']['accuracy']:.3f}", f"{h['cv_accuracy']:.3f} [{lo:.3f}, {hi:.3f}]"))
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    lines = [f"head of {res['model']} on {res['split']} ({res['n_queries']} queries; the head's accuracy is nested "
             f"{max([h.get('nested_folds', h['cv_folds']) for h in res['heads'].values()], default=3)}-fold "
             "cross-validated "
             "within this split (read, C and exit chosen again without each fold), with its 95 % Wilson interval; "
             "`qcls sweep … eval=test eval.fit_method=head` measures it on held-out queries):"]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head] + rows]
    lines += head_depth.table_lines(res["depth"]) if res.get("depth") else []
    lines += _baseline_lines(res, {p: h["cv_accuracy"] for p, h in res["heads"].items()}, "head (cv)")
    lines += _threshold_lines(res)
    lines += [f"note: {n}" for n in res.get("notes", [])]
    lines += [f"wrote {res['file']} and {res['weights']}", f"use it with the override: {res['override']}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from qcls.config.overrides import split_args
    from qcls.eval.dataset import DatasetError
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = build_parser()
    args = ap.parse_args(argv)
    stray, overrides = split_args(args.items)
    if stray:
        ap.error(f"unexpected argument(s) {stray}: give Hydra overrides as key=value")
    try:
        res = run(args, overrides)
    except (ConfigError, DatasetError, ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"qcls calibrate: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(res, ensure_ascii=False) if args.json else format_table(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
