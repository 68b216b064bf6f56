"""`qcls sweep`: ablation sweeps as Hydra multiruns over the qcls config, scored on a gold-labelled set.

`main(argv)` answers `--help` and `--report` itself; everything else is the normal Hydra command line
(`-m key=a,b …`), run as the `@hydra.main` application below over conf/sweep.yaml.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HELP = """usage: qcls sweep [-m] [OVERRIDE ...]
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
  eval.path=FILE     absolute, or relative to the current directory, then to the repository root
  eval.limit=N       score the first N queries (of each split)
  eval.fit_on=FILE   also fit a per-prompt calibration on FILE and report metrics with and without it
  eval.batch1_queries=N   queries also timed alone (batch 1); eval.agreement_with_exact=false skips the
                     extra exact pass that trie / first_token jobs need for winner agreement

Each job (in its Hydra folder: multirun/DATE/TIME/N/) builds the Classifier, reusing the model already
loaded by an earlier job of the same process when only scoring / prompts / engine / calibration differ,
classifies the set in batches of engine.max_batch_size, times batch1_queries queries alone, and writes
result.json (per prompt accuracy, macro-F1, confusion matrix, NLL, Brier, ECE over 15 bins; their means;
winner agreement with scoring=exact and how it was computed; latency p50/p90 at batch 1 and full batches;
tokens per forward; start-up and load seconds; GPU memory allocated and peak; device, commit, date) and
predictions.jsonl. A configuration that cannot run (memory budget, colliding first tokens, a missing
backend package, a bad dataset line) is a failed job with its reason; the sweep goes on and exits 0.

Report: at the end of every run the callback writes summary.md, summary.csv (one row per job, sorted by
mean accuracy, failed jobs with reasons), accuracy_latency.png (Pareto front marked) and reliability.png
(best job) into the sweep folder. `--report DIR ...` rebuilds it from jobs' result.json files (several
folders are merged; written into --out, default the first DIR).

Calibration: `qcls calibrate` fits a per-prompt temperature and label biases on the dev split and writes a
YAML file; load it with calibration=FILE (the tail applies it at no request cost). With eval=test each
job fits one on the dev split (eval.fit_on) and reports accuracy / NLL / ECE / Brier with and without it.

Launchers: the default (basic) launcher runs jobs one after another in this process, which allows the
model reuse. hydra/launcher=joblib (pip install 'qcls[sweep]') runs jobs in parallel processes (CPU).
Several GPUs: one sweep per GPU with CUDA_VISIBLE_DEVICES=i, then `qcls sweep --report DIR1 DIR2 --out D`.
Details: docs/evaluation.md. Hydra's own options: qcls sweep --hydra-help."""


def _task(cfg) -> dict:
    """One Hydra job (runs in the launcher's process: this one for the basic launcher)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from qcls.eval import job
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
    from qcls.eval.callback import write_report
    from qcls.eval.report import build
    if len(args.report) == 1 and args.out is None:
        write_report(Path(args.report[0]))
    else:
        out = build([Path(d) for d in args.report], Path(args.out) if args.out else None)
        print(f"[qcls] report of {out['jobs']} jobs ({out['failed']} failed): {out['dir'] / 'summary.md'}",
              file=sys.stderr)
    return 0


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

    from qcls.compose import ConfigError, conf_dir
    try:
        app = hydra.main(config_path=str(conf_dir()), config_name="sweep", version_base="1.3")(_task)
    except ConfigError as e:
        print(f"qcls sweep: error: {e}", file=sys.stderr)
        return 2
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
    sys.exit(main())
