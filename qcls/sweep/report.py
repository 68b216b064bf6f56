"""The sweep report: `summary.md`, `summary.csv` and plots, built from the jobs' result.json and
predictions.jsonl alone, so `qcls sweep --report DIR` rebuilds exactly what the end of the multirun wrote."""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qcls.heads.bounds import wilson
from qcls.sweep import plots
from qcls.sweep import report_baselines as baselines
from qcls.sweep import report_coverage
from qcls.sweep import report_depth as depth
from qcls.sweep.report_baselines import dig as _get

CAL = ("accuracy", "nll", "ece")


@dataclass
class Job:
    dir: Path
    result: dict[str, Any]


def collect(dirs: list[Path]) -> list[Job]:
    """Every job under `dirs`: a folder with a result.json, or a Hydra job folder (`.hydra/`) that has none
    (the job died before writing it; reported as failed)."""
    found: dict[Path, Job] = {}
    for root in dirs:
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"{root}: not a directory (give a sweep directory, e.g. multirun/DATE/TIME)")
        for f in sorted(root.rglob("result.json")):
            found[f.parent.resolve()] = Job(f.parent, json.loads(f.read_text(encoding="utf-8")))
        for h in sorted(root.rglob(".hydra")):
            job_dir = h.parent.resolve()
            if job_dir not in found and (h / "overrides.yaml").is_file() and not (job_dir / "multirun.yaml").exists():
                found[job_dir] = Job(h.parent, {"status": "failed", "overrides": _overrides(h / "overrides.yaml"),
                                                "reason": "no result.json: the job stopped before writing it"})
    return list(found.values())


def _overrides(path: Path) -> list[str]:
    import yaml
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or []
    return [str(x) for x in data]


def varying(jobs: list[Job]) -> tuple[list[str], list[str]]:
    """(override keys whose values differ between jobs, overrides shared by every job)."""
    maps = [dict(o.split("=", 1) for o in j.result.get("overrides", []) if "=" in o) for j in jobs]
    keys = sorted({k for m in maps for k in m})
    vary = [k for k in keys if len({m.get(k) for m in maps}) > 1]
    fixed = [f"{k}={maps[0][k]}" for k in keys if k not in vary and maps and k in maps[0]]
    return vary, fixed


def row(job: Job, out_dir: Path, vary: list[str]) -> dict[str, Any]:
    r = job.result
    ov = dict(o.split("=", 1) for o in r.get("overrides", []) if "=" in o)
    try:
        rel = str(job.dir.resolve().relative_to(out_dir.resolve()))
    except ValueError:
        rel = str(job.dir)
    out = {"job": rel, "status": r.get("status", "failed"),
           "label": " ".join(f"{k}={ov[k]}" for k in vary if k in ov) or rel,
           "overrides": " ".join(r.get("overrides", []))}
    for k in ("accuracy", "macro_f1", "nll", "brier", "ece"):
        out[f"mean_{k}"] = _get(r, "mean", k)
    for k in CAL:
        out[f"cal_{k}"] = _get(r, "calibration", "mean", "calibrated", k)
    out["forward_cost"] = _get(r, "forward", "forward_cost")
    out["agreement_exact"] = _get(r, "agreement_with_exact", "mean")
    out["agreement_method"] = _get(r, "agreement_with_exact", "method") or _get(r, "agreement_with_exact", "reason")
    for side, key in (("b1", "batch1"), ("batch", "full_batch")):
        for q in ("p50", "p90"):
            out[f"{side}_{q}_ms"] = _get(r, "latency_ms", key, q)
        out[f"{side}_tokens_per_forward"] = _get(r, "latency_ms", key, "tokens_per_forward")
    out["batch_size"] = _get(r, "config", "max_batch_size")
    out["startup_s"], out["load_s"], out["model_reused"] = r.get("startup_s"), r.get("load_s"), r.get("model_reused")
    out["gpu_allocated_gib"] = _get(r, "gpu_memory", "allocated_gib")
    out["gpu_peak_gib"] = _get(r, "gpu_memory", "peak_gib")
    for k in ("device", "commit", "date", "reason"):
        out[k] = r.get(k)
    out["majority_accuracy"] = _get(r, "baseline", "mean", "majority_accuracy")
    out["base_accuracy"] = _get(r, "baseline", "mean", "accuracy")
    out["base_macro_f1"] = _get(r, "baseline", "mean", "macro_f1")
    for p, m in (r.get("per_prompt") or {}).items():
        out[f"accuracy[{p}]"] = m.get("accuracy")
    for p, m in (_get(r, "calibration", "per_prompt") or {}).items():
        out[f"cal_accuracy[{p}]"] = _get(m, "calibrated", "accuracy")
    for size, acc in (_get(r, "calibration", "learning_curve", "mean_accuracy") or {}).items():
        out[f"curve[{size}]"] = acc
    n_eval = _get(r, "calibration", "learning_curve", "n_eval")
    out["curve_n"] = sum(n_eval.values()) if n_eval else None
    out.update(report_coverage.row_fields(r))
    return out


def sort_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ok = [x for x in rows if x["status"] == "ok" and x["mean_accuracy"] is not None]
    rest = [x for x in rows if x not in ok]
    ok.sort(key=lambda x: (-x["mean_accuracy"], x["b1_p50_ms"] if x["b1_p50_ms"] is not None else 1e18, x["job"]))
    rest.sort(key=lambda x: x["job"])
    return ok + rest


def build(dirs: list[Path], out_dir: Path | None = None) -> dict[str, Any]:
    """Write summary.md, summary.csv and the plots into `out_dir` (default: the first dir)."""
    dirs = [Path(d) for d in dirs]
    out_dir = Path(out_dir) if out_dir is not None else dirs[0]
    jobs = collect(dirs)
    if not jobs:
        raise FileNotFoundError(f"no sweep job (a folder with result.json or .hydra/) under "
                                f"{', '.join(map(str, dirs))}")
    out_dir.mkdir(parents=True, exist_ok=True)
    vary, fixed = varying(jobs)
    rows = sort_rows([row(j, out_dir, vary) for j in jobs])
    by_rel = {row(j, out_dir, vary)["job"]: j for j in jobs}
    images = {}
    ok = [x for x in rows if x["status"] == "ok"]
    if any(x["b1_p50_ms"] is not None for x in ok):
        images["accuracy_latency"] = plots.accuracy_latency(ok, out_dir / "accuracy_latency.png")
    cost_pts, tfidf = depth.points(ok, by_rel), depth.tfidf(ok, by_rel)
    if depth.wanted(cost_pts):
        images["accuracy_cost"] = depth.plot(cost_pts, tfidf, out_dir / "accuracy_cost.png")
    if any(k.startswith("curve[") for x in ok for k in x):
        images["learning_curve"] = plots.learning_curve(ok, out_dir / "learning_curve.png")
    if ok:
        best = by_rel[ok[0]["job"]]
        pred = best.dir / "predictions.jsonl"
        if pred.is_file():
            images["reliability"] = plots.reliability(_read_jsonl(pred), out_dir / "reliability.png",
                                                      f"best job: {ok[0]['label']}")
    abstention, img = report_coverage.section(ok, by_rel, out_dir)
    images.update(img)
    (out_dir / "summary.csv").write_text(_csv(rows), encoding="utf-8")
    cost_lines = depth.section(cost_pts, tfidf) if depth.wanted(cost_pts) else []
    (out_dir / "summary.md").write_text(_markdown(rows, fixed, jobs, images, by_rel, cost_lines, abstention),
                                        encoding="utf-8")
    return {"dir": out_dir, "rows": rows, "jobs": len(rows), "failed": sum(x["status"] != "ok" for x in rows),
            "images": images}


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def _fmt(v: Any, nd: int = 4) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def _csv(rows: list[dict[str, Any]]) -> str:
    cols: list[str] = []
    for x in rows:
        cols += [k for k in x if k not in cols]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for x in rows:
        w.writerow({k: _fmt(x.get(k), 6) for k in cols})
    return buf.getvalue()


TABLE = [("job", "job"), ("label", "configuration"), ("mean_accuracy", "accuracy"), ("mean_macro_f1", "macro-F1"),
         ("majority_accuracy", "majority acc"), ("base_accuracy", "TF-IDF acc"), ("base_macro_f1", "TF-IDF F1"),
         ("mean_nll", "NLL"), ("mean_brier", "Brier"), ("mean_ece", "ECE"), ("cal_accuracy", "acc (cal/head)"),
         ("cal_nll", "NLL (cal/head)"), ("cal_ece", "ECE (cal/head)"), ("forward_cost", "forward cost"),
         ("agreement_exact", "agree exact"),
         ("b1_p50_ms", "p50 ms b=1"), ("b1_p90_ms", "p90 ms b=1"), ("batch_p50_ms", "p50 ms full batch"),
         ("batch_p90_ms", "p90 ms full batch"), ("batch_size", "batch"), ("b1_tokens_per_forward", "tokens/fwd b=1"),
         ("batch_tokens_per_forward", "tokens/fwd batch"), ("startup_s", "start-up s"), ("load_s", "load s"),
         ("model_reused", "model reused"), ("gpu_allocated_gib", "GPU alloc GiB"), ("gpu_peak_gib", "GPU peak GiB")]


def _with_interval(acc: float | None, n: int | None) -> str:
    """`0.921 [0.867, 0.954]`: an accuracy on n scored pairs with its 95 % Wilson interval (no n: the value)."""
    if acc is None or not n:
        return _fmt(acc, 3)
    lo, hi = wilson(int(round(acc * n)), n)
    return f"{acc:.3f} [{lo:.3f}, {hi:.3f}]"


def _md_table(header: list[str], body: list[list[str]]) -> list[str]:
    esc = [[c.replace("|", "\\|") for c in line] for line in [header] + body]
    lines = ["| " + " | ".join(x) + " |" for x in esc]
    return lines[:1] + ["|" + "---|" * len(header)] + lines[1:]


def _span(values: list[str]) -> str:
    return "n/a" if not values else values[0] if len(values) == 1 else f"{values[0]} … {values[-1]}"


def _markdown(rows: list[dict[str, Any]], fixed: list[str], jobs: list[Job], images: dict[str, Path],
              by_job: dict[str, Job], cost_lines: list[str], abstention: list[str] = ()) -> str:
    ok = [x for x in rows if x["status"] == "ok"]
    failed = [x for x in rows if x["status"] != "ok"]
    sets = sorted({f"{_get(j.result, 'eval', 'path')} ({_get(j.result, 'eval', 'n_queries')} queries)"
                   for j in jobs if _get(j.result, "eval", "path")})
    lines = ["# qcls sweep report", "",
             f"{len(rows)} jobs: {len(ok)} ok, {len(failed)} failed. Sorted by mean accuracy over prompts.", "",
             f"- eval set: {'; '.join(sets) or 'none'}",
             f"- device: {', '.join(sorted({str(x['device']) for x in ok if x['device']})) or 'n/a'}",
             f"- commit: {', '.join(sorted({str(x['commit']) for x in rows if x['commit']})) or 'n/a'}",
             f"- dates: {_span(sorted({str(x['date']) for x in rows if x['date']}))}",
             f"- overrides common to every job: `{' '.join(fixed)}`" if fixed else "- no override common to every job",
             ""]
    cols = [c for c in TABLE if any(x.get(c[0]) is not None for x in ok)]
    lines += _md_table([h for _, h in cols], [[_fmt(x.get(k), 3 if k.endswith(("_ms", "_s")) else 4) for k, _ in cols]
                                              for x in ok])
    prompts = [k for x in ok for k in x if k.startswith("accuracy[")]  # raw scores' accuracy per prompt
    prompts = list(dict.fromkeys(prompts))
    if prompts:
        lines += ["", "## Accuracy per prompt", ""]
        lines += _md_table(["job", "configuration"] + [p[9:-1] for p in prompts],
                           [[x["job"], x["label"]] + [_fmt(x.get(p), 3) for p in prompts] for x in ok])
    lines += cost_lines
    lines += baselines.section(ok, by_job)
    lines += abstention
    curve = list(dict.fromkeys(k for x in ok for k in x if k.startswith("curve[")))
    if curve:
        lines += ["", "## Learning curve", "",
                  "Held-out mean accuracy of heads fitted on random subsets of the fitting split's labelled queries "
                  "(mean over draws and prompts; the same subsets for every job; `all` = every fitting query), with "
                  "its 95 % Wilson interval over the scored (prompt, query) pairs (`pairs`): the scored split's own "
                  "sampling error, which two jobs on the same split share.", ""]
        lines += _md_table(["job", "configuration", "pairs"] + [f"n={k[6:-1]}" for k in curve],
                           [[x["job"], x["label"], _fmt(x.get("curve_n"))] + [_with_interval(x.get(k), x.get("curve_n"))
                                                                         for k in curve] for x in ok
                            if any(x.get(k) is not None for k in curve)])
    warned = [(x, _get(by_job[x["job"]].result, "calibration", "warning")) for x in ok]
    warned = [(x, w) for x, w in warned if w]
    if warned:
        lines += ["", "## Warnings", ""]
        lines += [f"- `{x['job']}` ({x['label']}): {w}" for x, w in warned]
    if failed:
        lines += ["", "## Failed jobs", ""]
        lines += [f"- `{x['job']}` ({x['label']}): {x['reason']}" for x in failed]
    if images:
        lines += ["", "## Plots", ""]
        lines += [f"![{name}]({p.name})" for name, p in images.items()]
    lines += ["", "## Columns", "",
              "Metrics are means over prompts of per-prompt values on the queries with a gold label for that "
              "prompt (docs/design.md §9): accuracy, macro-F1, NLL = mean −log p(gold), Brier, ECE over 15 "
              "equal-width bins of the winner's probability. `(cal/head)`: on the same split after a per-prompt "
              "temperature/bias calibration or learned head (fitted on `eval.fit_on` with `eval.fit_method`, or "
              "the config's `calibration` file). `majority acc`, `TF-IDF acc`, `TF-IDF F1`: the baselines of "
              "qcls/fitting/baseline.py (the fitting split's most frequent label; a character n-gram TF-IDF + "
              "logistic regression fitted on `eval.fit_on`, else cross-validated on the scored split). "
              "`forward cost`: layers run / N of the forward the heads need (the deepest read; all N without a "
              "head, for raw scores or a calibration). `agree exact`: share of queries whose winner equals the "
              "`exact` strategy's (how: result.json `agreement_with_exact.method`). Latency: p50/p90 ms of "
              "requests of one query and of full batches (`engine.max_batch_size`), from the results' stage "
              "timings. Per-job details: "
              "`<job>/result.json`, `<job>/predictions.jsonl`.", ""]
    return "\n".join(lines)
