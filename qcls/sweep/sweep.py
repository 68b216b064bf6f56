"""`qcls sweep`: ablation sweeps as Hydra multiruns over the qcls config, scored on a gold-labelled set.

`main(argv)` answers `--help` and `--report` itself; everything else is the normal Hydra command line
(`-m key=a,b …`), run as the `@hydra.main` application below over conf/sweep.yaml.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from qcls.errors import ConfigError

HELP = """usage: qcls sweep [-m] [--out DIR] [OVERRIDE ...]
       qcls sweep --report DIR [DIR ...] [--out DIR]

Score qcls configurations on a gold-labelled query set: one Hydra job per configuration, one report.

  qcls sweep -m scoring=trie,first_token,exact,mean_logprob eval=dev
  qcls sweep -m backend=fp16,bnb-int8 scoring=trie,first_token prompts=default,ecommerce8
  qcls sweep -m prompts=default,default_fewshot eval=test          # test split, calibration fitted on dev
  qcls sweep scoring=exact eval.path=/data/my_queries.jsonl eval.limit=100   # one job

Eval set (`eval` group, conf/eval/dev.yaml, test.yaml): a JSONL file, one object a line:
  {"query": "red knit dress", "labels": {"category": "knit", "color": "red"}}
A prompt missing from `labels` is not scored for that query; labels for prompts that the config does not
have are ignored (a set labelled for prompts=ecommerce8 serves prompts=default). Refused at start-up with
file, line and reason: a label outside the prompt's label set, a duplicate query, an empty file, a line
that is not a JSON object with a non-empty string `query` and an object `labels` (optional string `note`).
Or a .csv / .tsv table (UTF-8): a header `query,<prompt>,<prompt>,…` and one row per query; an empty cell
means no gold label for that prompt; refusals name the row (docs/evaluation.md).
  eval.path=FILE     absolute, or relative to the current directory, then to the repository root
  eval.limit=N       score the first N queries (of each split)
  eval.fit_on=FILE   also fit a per-prompt calibration on FILE and report metrics with and without it
  eval.fit_method=head   …a learned head instead (eval.head.layer / read / scores / cv_folds / nested_folds /
                     layer_rule / max_layer are axes too), with a learning curve (eval.head.curve_sizes, curve_draws);
                     e.g. -m eval=test eval.fit_method=head eval.head.layer=3,6,9,12,final: the report adds
                     accuracy against forward cost (layers run / N) per prompt, Pareto front and TF-IDF
  eval.batch1_queries=N   queries also timed alone (batch 1); eval.agreement_with_exact=false skips the
                     extra exact pass that trie / first_token jobs need for winner agreement

Each job (in its Hydra folder: multirun/DATE/TIME/N/, or DIR/N/ with --out DIR) builds the Classifier, reusing the model already
loaded by an earlier job of the same process when only scoring / prompts / engine / calibration differ,
classifies the set in batches of engine.max_batch_size, times batch1_queries queries alone, and writes
result.json (per prompt accuracy, macro-F1, confusion matrix, NLL, Brier, ECE over 15 bins; their means;
winner agreement with scoring=exact and how it was computed; latency p50/p90 at batch 1 and full batches;
tokens per forward; start-up and load seconds; GPU memory allocated and peak; device, commit, date; the
baselines: majority class and a character n-gram TF-IDF + logistic regression per prompt, fitted on
eval.fit_on, else cross-validated on the scored split) and predictions.jsonl. A configuration that cannot run (memory budget, colliding first tokens, a missing
backend package, a bad dataset line) is a failed job with its reason; the sweep goes on and exits 0. A bad override
or value, or an eval.path / eval.fit_on that is not a file, stops the sweep before any job runs (exit 2).

Report: at the end of every run the callback writes summary.md, summary.csv (one row per job, sorted by
mean accuracy, failed jobs with reasons), accuracy_latency.png (Pareto front marked), reliability.png
(best job) and, where a head reads an earlier layer, accuracy_cost.png (per prompt) into the sweep folder. `--report DIR ...` rebuilds it from jobs' result.json files (several
folders are merged; written into --out, default the first DIR).

Calibration and heads: `qcls calibrate` fits a per-prompt temperature and label biases (or, with --method
head, a learned head on the hidden state) on the dev split and writes a file; load it with calibration=FILE
(the tail applies it at no request cost). With eval=test each job fits one on the dev split (eval.fit_on,
eval.fit_method) and reports accuracy / macro-F1 / NLL / ECE / Brier with and without it.

Launchers: the default (basic) launcher runs jobs one after another in this process, which allows the
model reuse. hydra/launcher=joblib (pip install 'qcls[sweep]') runs jobs in parallel processes (CPU).
Several GPUs: python -m qcls.sweep.sweep_gpus --devices 0,1,2,3 -- -m … splits the jobs, runs one
sweep per GPU (CUDA_VISIBLE_DEVICES=i) and merges them (`qcls sweep --report DIR1 DIR2 --out D`).
Details: docs/evaluation.md. Hydra's own options: qcls sweep --hydra-help."""


def _task(cfg) -> dict:
    """One Hydra job (runs in the launcher's process: this one for the basic launcher)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from qcls.sweep import job
    hc = HydraConfig.get()
    info = {"num": OmegaConf.select(hc, "job.num", default=0),
            "id": OmegaConf.select(hc, "job.id", default=None), "pid": os.getpid()}
    result = job.run(cfg, Path(hc.runtime.output_dir), list(hc.overrides.task), info)
    return {"status": result["status"], "reason": result["reason"]}


def report_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="qcls sweep --report", description="Rebuild a sweep's report.")
    ap.add_argument("--report", nargs="+", required=True, metavar="DIR", help="sweep folder(s) to read")
    ap.add_argument("--out", metavar="DIR", help="where to write the report (default: the first DIR)")
    args = ap.parse_args(argv)
    from qcls.sweep.callback import write_report
    from qcls.sweep.report import build
    if len(args.report) == 1 and args.out is None:
        write_report(Path(args.report[0]))
    else:
        out = build([Path(d) for d in args.report], Path(args.out) if args.out else None)
        print(f"[qcls] report of {out['jobs']} jobs ({out['failed']} failed): {out['dir'] / 'summary.md'}",
              file=sys.stderr)
    return 0


def with_out(argv: list[str]) -> list[str]:
    """`--out DIR`, as every command that writes files takes it: the sweep's folder (hydra.run.dir and
    hydra.sweep.dir)."""
    rest, out, it = [], None, iter(argv)
    for a in it:
        if a == "--out" or a.startswith("--out="):
            out = a.partition("=")[2] or next(it, "")
            if not out:
                raise ConfigError("--out needs a folder", "give --out DIR")
        else:
            rest.append(a)
    if out is None:
        return argv
    if any(a.split("=", 1)[0].lstrip("+~") in ("hydra.run.dir", "hydra.sweep.dir") for a in rest):
        raise ConfigError(f"--out {out} and hydra.run.dir / hydra.sweep.dir both name the sweep's folder",
                          "give one of them")
    return [*rest, f"hydra.run.dir={out}", f"hydra.sweep.dir={out}"]


def preflight(argv: list[str], files: bool = True) -> None:
    """Compose and validate every value of every swept key (each with the other keys' first values) before
    Hydra starts: otherwise Hydra prints its own error for a bad override and exits 1, or a job fails on a
    config that could never run (an eval.path or eval.fit_on that is not a file among them). Per-configuration
    failures found later (memory budget, colliding first tokens, a missing backend package) remain failed jobs of a
    sweep that goes on. files=False leaves the data files unchecked (a documented command line, checked where the
    user's files are not)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from qcls.config.compose import ConfigError, compose_raw
    from qcls.eval.dataset import DatasetError
    from qcls.eval.spec import resolve_path, split_config
    items = [a for a in argv if not a.startswith("-") and ("=" in a or a.startswith("~"))]
    try:
        parsed = OverridesParser.create().parse_overrides(items)
    except HydraException as e:
        raise ConfigError(f"bad override: {e}") from None
    keep, swept = [], []
    for item, o in zip(items, parsed):
        if o.get_key_element().startswith("hydra"):  # Hydra's own settings (launcher, run dirs): Hydra checks them
            continue
        if not o.is_sweep_override():
            keep.append(item)
            continue
        head = item[:len(item) - len(item.lstrip("+~"))]
        try:
            swept.append([f"{head}{o.get_key_element()}={v}" for v in o.sweep_string_iterator()])
        except HydraException:  # an interval sweep (for optimising sweepers) has no list of values
            continue
    combos = [keep + [vals[0] for vals in swept]]
    combos += [keep + [v if j == i else vals[0] for j, vals in enumerate(swept)]
               for i, values in enumerate(swept) for v in values[1:]]
    for combo in combos:
        spec, _ = split_config(compose_raw(combo, config_name="sweep"))
        for what, value in (("eval.path", spec.path), ("eval.fit_on", spec.fit_on)) if files else ():
            if value:  # a file that is not there fails every job it is in: refuse it now
                try:
                    resolve_path(value, what)
                except DatasetError as e:
                    raise ConfigError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(HELP)
        return 0
    if "--report" in argv:
        try:
            return report_main(argv)
        except (FileNotFoundError, ValueError) as e:
            print(f"qcls sweep: error: {e}", file=sys.stderr)
            return 2
    import hydra

    from qcls.config.compose import conf_dir
    argv = with_out(argv)
    preflight(argv)  # a bad override or value is one ConfigError (exit 2 in the CLI) before any job runs
    app = hydra.main(config_path=str(conf_dir()), config_name="sweep", version_base="1.3")(_task)
    saved = sys.argv
    sys.argv = ["qcls-sweep", *argv]  # hydra.main reads its command line from sys.argv
    try:
        app()
    except SystemExit as e:  # Hydra exits 1 on a bad override, after printing why
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = saved
    return 0


if __name__ == "__main__":
    from qcls.errors import run_guarded
    sys.exit(run_guarded(main, prog="qcls sweep"))
