"""One sweep job: build the Classifier (reusing the loaded model), score the labelled set, time it, and
write `result.json` + `predictions.jsonl` into the job's directory. A job that cannot run is recorded as
failed with its reason; it never raises, so the sweep goes on."""
from __future__ import annotations

import json
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from qcls.config import QclsConfig
from qcls.sweep import agreement, coverage, models, timing
from qcls.fitting import baseline, calibrated_metrics
from qcls.eval import metrics
from qcls.eval.dataset import EvalSet, load_eval_set
from qcls.eval.scores import PromptScores, by_prompt, classify_set
from qcls.eval.spec import EvalSpec, resolve_path, split_config
from qcls.config.paths import shown
from qcls.progress import step_note

MEAN_KEYS = ("accuracy", "macro_f1", "majority_accuracy", "nll", "brier", "ece")


def run(cfg_node, out_dir: Path, overrides: list[str], job: dict[str, Any]) -> dict[str, Any]:
    """Run one job and write its files; returns the result (status ok or failed)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    result: dict[str, Any] = {"status": "failed", "reason": None, "overrides": list(overrides), "job": job,
                              "date": timing.now(), "commit": timing.commit()}
    rows: list[dict[str, Any]] = []
    try:
        spec, cfg = split_config(cfg_node)
        result["config"] = _config_summary(cfg, spec)
        body, rows = evaluate(spec, cfg, out_dir)
        result.update(body, status="ok")
    except Exception as e:  # any reason a configuration cannot run becomes the job's recorded reason
        result["reason"] = f"{type(e).__name__}: {e}"
        result["traceback"] = traceback.format_exc(limit=-4)
        del e
    finally:
        models.free_memory()
    result["job_s"] = round(time.perf_counter() - t0, 3)
    (out_dir / "result.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    with (out_dir / "predictions.jsonl").open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tag = " ".join(overrides) or "(no overrides)"
    if result["status"] == "ok":
        step_note(f"sweep job {job.get('num')}: {tag}: mean accuracy {result['mean']['accuracy']:.3f}")
    else:
        step_note(f"sweep job {job.get('num')}: {tag}: FAILED: {result['reason']}")
    return result


def evaluate(spec: EvalSpec, cfg: QclsConfig, out_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from qcls.classifier import Classifier  # torch and the engine load only when a job runs

    timing.reset_peak()
    # a job scores the LLM's own labels beside any head's, so its forward runs every layer (the exit would leave
    # no label scores); the notes say so, and the head's cost at its own depth is in the heads' block
    exit_off = cfg.engine.layer_exit
    cfg = cfg.model_copy(update={"engine": cfg.engine.model_copy(update={"layer_exit": False})})
    data = load_eval_set(resolve_path(spec.path), cfg.prompts, spec.limit)
    fit_data = load_eval_set(resolve_path(spec.fit_on, "eval.fit_on"), cfg.prompts, spec.limit) \
        if spec.fit_on else None
    loaded = models.take(cfg)
    reused = loaded is not None
    if reused:
        models.budget_check(cfg, loaded)
    t0 = time.perf_counter()
    clf = Classifier(cfg, loaded=loaded)
    startup = time.perf_counter() - t0
    if not reused:
        models.keep(cfg, clf.loaded)
    loaded = clf.loaded
    results, requests = classify_set(clf, data)
    b1 = timing.time_batch1(clf, data.queries[:spec.batch1_queries])
    memory = timing.gpu_memory(loaded.device)
    per = by_prompt(results, data)
    body: dict[str, Any] = {
        "model_reused": reused, "startup_s": round(startup, 3), "startup_phases_s": dict(clf.startup_s),
        "load_s": None if reused else clf.startup_s.get("load"), "device": timing.device_name(loaded.device),
        "strategy": cfg.strategy, "heads": clf.heads_meta,
        "engine_notes": list(clf.notes) + (["every layer runs: the job scores the LLM's labels beside the heads' "
                                            "(engine.layer_exit is off in evaluation jobs)"] if exit_off else []),
        "eval": {"path": str(data.path), "n_queries": len(data.examples), "ignored_prompts": data.ignored_prompts,
                 "unlabelled_lines": len(data.unlabelled_lines), "limit": spec.limit},
        "latency_ms": {"batch1": timing.latency(b1, 1),
                       "full_batch": timing.latency(requests, cfg.engine.max_batch_size)},
        "gpu_memory": memory,
    }
    body["per_prompt"] = {p: metrics.prompt_metrics(*ps.labelled(), ps.labels) for p, ps in per.items()}
    body["mean"] = metrics.mean_over_prompts(body["per_prompt"], MEAN_KEYS)
    # the cheap baselines on the same splits: fitted on eval.fit_on, else on the split the loaded head file was
    # fitted on, else cross-validated on the scored split
    base_fit = fit_data or _head_split(clf, data, cfg, spec)
    body["baseline"] = baseline.block(cfg.prompts, data, base_fit, spec.head.cv_folds)
    if fit_data is not None and spec.fit_method == "head":
        from qcls.fitting.head_fitting import sweep_block
        body["calibration"], cal_probs = sweep_block(spec, cfg, loaded, per, fit_data, data, out_dir)
    else:
        body["calibration"], cal_probs = _calibration(spec, cfg, clf, per, fit_data, data, out_dir)
    # abstention: the precision-coverage curve, and the loaded file's thresholds (a job's own fit has none)
    served = clf.head if fit_data is None else None
    body["coverage"] = coverage.job_block(cfg, per, cal_probs, served, data, base_fit, body["baseline"],
                                          spec.head.cv_folds)
    if served is None and clf.head is not None and any(ph.threshold for ph in clf.head.prompts.values()):
        body["coverage"]["note"] = ("the head file's thresholds are not reported: this job fits its own "
                                    f"{spec.fit_method} on eval.fit_on (eval.fit_on=null scores with the file)")
    # a calibration fitted in the job reads the raw scores (all layers); a loaded head file reads what it reads
    body["forward"] = _forward(body["calibration"], None if fit_data is not None else clf.head, per, loaded)
    full_head = loaded.full_head() is not None
    del clf, results  # the job's engine goes before the exact pass builds another on the same weights
    models.free_memory()
    body["agreement_with_exact"], exact = agreement.compute(
        cfg.strategy, per, spec.agreement_with_exact, full_head, lambda: _exact_pass(cfg, loaded, data))
    return body, _prediction_rows(data, per, exact, cal_probs, served)


def _calibration(spec, cfg, clf, per, fit_data: EvalSet | None, data: EvalSet, out_dir: Path):
    """The with/without-calibration block and the calibrated probabilities per prompt (or None, None)."""
    if fit_data is not None:
        fit_results, _ = classify_set(clf, fit_data)
        fit_per = by_prompt(fit_results, fit_data)
        meta = {"strategy": cfg.strategy, "model": cfg.model.name, "fitted_on": shown(fit_data.path)}
        cal = calibrated_metrics.fit_on_split(fit_per, spec.fit_method, meta)
        cal.save(out_dir / "calibration.yaml")
        block = calibrated_metrics.fitted_columns(per, cal, f"fitted on {fit_data.path}")
        overlap = len(set(fit_data.queries) & set(data.queries))
        if overlap:
            block["warning"] = f"{overlap} queries are in both the fit split and the eval split"
        return block, {p: metrics.softmax(calibrated_metrics.apply(cal, p, ps.scores)) for p, ps in per.items()}
    if cfg.calibration is not None and clf.head is not None:
        block = calibrated_metrics.file_columns(per, clf.head_path, clf.head.method)
        fitted_on = clf.head.meta.get("fitted_on")
        if fitted_on and _same_file(fitted_on, data.path):
            block["warning"] = (f"the file was fitted on this split ({fitted_on}): its columns are not held out "
                                "(eval=test scores the held-out split)")
        block["heads"] = clf.heads_meta
        return block, {p: metrics.softmax(v) for p, v in calibrated_metrics.file_logits(per).items()}
    return None, None


def _forward(calibration: dict | None, head, per: dict, loaded) -> dict[str, Any]:
    """What the forward costs with the heads behind the calibrated columns (a head fitted in the job, or the
    loaded file's): per prompt the layer read and layers run / N (qcls/fitting/head_depth.py)."""
    from qcls.fitting.head_depth import forward_costs
    from qcls.fitting.head_fitting import serving_reads
    from qcls.heads.weights_fingerprint import num_layers
    if calibration and calibration.get("forward"):
        return calibration["forward"]
    return forward_costs(serving_reads(head if calibration else None, list(per)), num_layers(loaded.model.config))


def _head_split(clf, data: EvalSet, cfg: QclsConfig, spec: EvalSpec) -> EvalSet | None:
    """The split the loaded head file records as its fitting split (meta.fitted_on), when it is here and is not
    the scored split: the baselines then see what the head saw."""
    fitted_on = clf.head.meta.get("fitted_on") if clf.head is not None else None
    if not fitted_on or _same_file(fitted_on, data.path):
        return None
    try:
        return load_eval_set(resolve_path(fitted_on, "fitted_on"), cfg.prompts, spec.limit)
    except Exception as e:  # a file that is not here: the baselines are cross-validated instead (and say so)
        step_note(f"the head's fitting split {fitted_on} cannot be read ({e}): baselines cross-validated on "
                  f"{data.path}")
        return None


def _same_file(recorded: str, path: Path) -> bool:
    """Whether a head file's `fitted_on` (absolute, or relative to the repository) names `path`."""
    try:
        return resolve_path(recorded, "fitted_on") == Path(path).resolve()
    except Exception:  # a file that is not here is not this split
        return False


def _exact_pass(cfg: QclsConfig, loaded, data: EvalSet) -> dict[str, np.ndarray]:
    from qcls.classifier import Classifier
    exact_cfg = cfg.model_copy(update={"scoring": cfg.scoring.model_copy(update={"name": "exact"}),
                                       "force_single_token_labels": False, "calibration": None})
    clf = Classifier(exact_cfg, loaded=loaded)
    try:
        results, _ = classify_set(clf, data)
        return {p: ps.winners for p, ps in by_prompt(results, data).items()}
    finally:
        del clf
        models.free_memory()


def _prediction_rows(data: EvalSet, per: dict[str, PromptScores], exact: dict[str, np.ndarray] | None,
                     cal_probs: dict[str, np.ndarray] | None, head=None) -> list[dict[str, Any]]:
    """predictions.jsonl: per query and prompt the gold label, the raw winner, every label's raw probability
    and score, and where known the exact strategy's winner and the calibrated probabilities."""
    rows = []
    for i, e in enumerate(data.examples):
        prompts = {}
        for p, ps in per.items():
            probs = metrics.softmax(ps.scores[i:i + 1])[0]
            d: dict[str, Any] = {"gold": ps.labels[ps.gold[i]] if ps.gold[i] >= 0 else None,
                                 "winner": ps.labels[int(ps.winners[i])],
                                 "probs": {lab: float(v) for lab, v in zip(ps.labels, probs)},
                                 "scores": {lab: float(v) for lab, v in zip(ps.labels, ps.scores[i])}}
            if exact is not None:
                d["exact_winner"] = ps.labels[int(exact[p][i])]
            if cal_probs is not None:
                d["calibrated_probs"] = {lab: float(v) for lab, v in zip(ps.labels, cal_probs[p][i])}
                t = head.prompts[p].threshold if head is not None and p in head.prompts else None
                if t is not None:  # the served result would abstain (qcls/heads/thresholds.py)
                    top = int(cal_probs[p][i].argmax())
                    d["abstained"] = bool(cal_probs[p][i][top] < t.needed(ps.labels[top]))
            prompts[p] = d
        rows.append({"line": e.line, "query": e.query, "prompts": prompts})
    return rows


def _config_summary(cfg: QclsConfig, spec: EvalSpec) -> dict[str, Any]:
    from qcls.backends.registry import resolved_name
    return {"model": cfg.model.name, "backend": resolved_name(cfg), "strategy": cfg.strategy,  # auto: what it ran
            "engine": cfg.engine.kind, "max_batch_size": cfg.engine.max_batch_size,
            "prompts": [p.name for p in cfg.prompts], "calibration": cfg.calibration_file,
            "calibration_is_default": cfg.calibration_is_default,
            "eval": spec.model_dump()}
