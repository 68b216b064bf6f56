"""`qcls calibrate`: fit a per-prompt calibration on a labelled split and write the YAML file that the
`calibration` config option loads (design.md §9; qcls/eval/calibration.py does the math)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from qcls.compose import ConfigError

EPILOG = """examples:
  qcls calibrate                                   # the demo model, prompts=default, scoring=trie, dev split
  qcls calibrate prompts=ecommerce8 scoring=exact --method temperature
  qcls calibrate --eval /data/my_dev.jsonl --out calibration/mine.yaml model=qwen3_4b model.source=local model.path=/m
  qcls calibrate --method contextual               # bias = -log p(label | "N/A", "[MASK]"), T = 1

Methods: temperature_bias (default: per prompt a temperature T and per-label biases b minimising the NLL
of the gold labels; calibrated score = (score + b) / T), temperature (T only), bias (b only), contextual
(Zhao et al. 2021: b = -log p_cf measured on content-free inputs, T = 1; the split is only used to print
the before/after metrics). A calibration holds for the model, prompts and scoring strategy it was fitted
under; a file fitted under another strategy is refused at start-up. The metrics printed are on the split
the calibration was fitted on (optimistic for fitted methods); `qcls sweep -m ... eval=test` reports
held-out numbers. Load the file with the override calibration=FILE. See docs/evaluation.md."""


def build_parser() -> argparse.ArgumentParser:
    from qcls.scoring.calibration import METHODS
    ap = argparse.ArgumentParser(prog="qcls calibrate", epilog=EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 description="Fit per-prompt calibration on a gold-labelled split and write it "
                                             "as YAML; key=value arguments are Hydra overrides.")
    ap.add_argument("--eval", default="dev", metavar="dev|test|PATH",
                    help="a split of conf/eval/ (default dev) or a JSONL file")
    ap.add_argument("--method", default="temperature_bias", choices=METHODS)
    ap.add_argument("--out", metavar="FILE.yaml",
                    help="default: calibration/<model>_<prompts>_<strategy>.yaml under the current directory")
    ap.add_argument("--limit", type=int, metavar="N", help="use the first N queries of the split")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("items", nargs="*", metavar="OVERRIDE")
    return ap


def split_path(value: str) -> Path:
    """`dev` / `test` → the file conf/eval/<name>.yaml names; anything else is a path."""
    from qcls.compose import conf_dir
    from qcls.eval.spec import named_split, resolve_path
    if (conf_dir() / "eval" / f"{value}.yaml").is_file():
        return resolve_path(named_split(value).path, f"conf/eval/{value}.yaml path")
    return resolve_path(value, "--eval")


def prompts_group(cfg) -> str | None:
    """The conf/prompts/<name>.yaml whose prompts are exactly the config's, if one is."""
    from omegaconf import OmegaConf

    from qcls.compose import conf_dir
    from qcls.config import PromptSpec
    for f in sorted((conf_dir() / "prompts").glob("*.yaml")):
        try:
            listed = OmegaConf.to_container(OmegaConf.load(f), resolve=True).get("prompts", [])
            if [PromptSpec.model_validate(p) for p in listed] == list(cfg.prompts):
                return f.stem
        except Exception:  # a file that does not parse is simply not this config's group
            continue
    return None


def default_out(cfg, method: str) -> Path:
    prompts = prompts_group(cfg) or "-".join(p.name for p in cfg.prompts)[:60]
    tail = "" if method == "temperature_bias" else f"_{method}"
    return Path("calibration") / f"{cfg.model.name}_{prompts}_{cfg.strategy}{tail}.yaml"


def run(args: argparse.Namespace, overrides: list[str]) -> dict[str, Any]:
    from qcls.classifier import Classifier
    from qcls.compose import compose
    from qcls.eval import calibrated_metrics
    from qcls.eval.calibration import contextual
    from qcls.eval.dataset import load_eval_set
    from qcls.eval.scores import by_prompt, classify_set

    cfg = compose(overrides)
    data = load_eval_set(split_path(args.eval), cfg.prompts, args.limit)  # refused before the model loads
    out = Path(args.out) if args.out else default_out(cfg, args.method)
    clf = Classifier(cfg)
    results, _ = classify_set(clf, data)
    per = by_prompt(results, data)
    if args.method == "contextual":
        cal = contextual(clf)
    else:
        meta = {"strategy": cfg.strategy, "model": cfg.model.name, "fitted_on": str(data.path)}
        cal = calibrated_metrics.fit_on_split(per, args.method, meta)
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
            "calibration": {p: {"temperature": pc.temperature, "bias": dict(zip(pc.labels, pc.bias))}
                            for p, pc in cal.prompts.items()}}


def format_table(res: dict[str, Any]) -> str:
    def pair(before: dict, after: dict, key: str) -> str:
        if before.get(key) is None:
            return "-"
        return f"{before[key]:.3f} → {after[key]:.3f}"
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
    lines += [f"wrote {res['file']}", f"use it with the override: {res['override']}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from qcls.cli import split_args
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
