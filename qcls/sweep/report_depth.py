"""The report's "Accuracy against forward cost" section and plot: per prompt, every job's accuracy (with its head
or calibration where it has one, else the raw scores) against the share of the forward its answer needs
(layers run / N, qcls/fitting/head_depth.py), the Pareto front marked, beside the TF-IDF baseline (which runs no
LLM at all). A sweep over `eval.head.layer` or `eval.head.max_layer` draws the trade-off."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from qcls.sweep.plots import _pyplot, pareto_front, saved
from qcls.sweep.report_baselines import dig


def points(ok: list[dict[str, Any]], by_job: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per prompt one point per job that records its forward (result.json `forward`)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for x in ok:
        r = by_job[x["job"]].result
        fw = r.get("forward")
        if not fw:
            continue
        for p, v in fw["per_prompt"].items():
            acc = x.get(f"cal_accuracy[{p}]")
            acc = x.get(f"accuracy[{p}]") if acc is None else acc
            if acc is None:
                continue
            read = dig(r, "calibration", "heads", p, "read")
            out.setdefault(p, []).append({
                "job": x["job"], "label": x["label"], "accuracy": float(acc), "cost": float(v["forward_cost"]),
                "layers": f"{v['layers_run']}/{fw['num_layers']}", "job_cost": float(fw["forward_cost"]),
                "read": f"{read['kind']}@{read['layer']}" if isinstance(read, dict) else
                        "raw scores" if v["read_layer"] is None else f"layer {v['read_layer']}"})
    return out


def tfidf(ok: list[dict[str, Any]], by_job: dict[str, Any]) -> dict[str, float]:
    """Per prompt the TF-IDF baseline's accuracy (of the first job that has it)."""
    out: dict[str, float] = {}
    for x in ok:
        for p, v in (dig(by_job[x["job"]].result, "baseline", "per_prompt") or {}).items():
            if p not in out and v.get("accuracy") is not None:
                out[p] = float(v["accuracy"])
    return out


def wanted(pts: dict[str, list[dict[str, Any]]]) -> bool:
    """Whether the section says anything: some answer needs less than the whole forward."""
    return any(q["cost"] < 1.0 for qs in pts.values() for q in qs)


def section(pts: dict[str, list[dict[str, Any]]], base: dict[str, float]) -> list[str]:
    lines = ["", "## Accuracy against forward cost", "",
             "Per prompt, each job's accuracy (with its head or calibration, else the raw scores) against the share "
             "of the forward its answer needs: layers run / N, where a head reading the stream after L layers "
             "needs L and the raw scores, `final` or a head on the scores need all N. A job's forward runs the "
             "deepest of its prompts' reads (`job cost`). `front`: on the Pareto front (no job is both cheaper "
             "and at least as accurate). TF-IDF runs no LLM (cost 0).", ""]
    for p, qs in pts.items():
        front = set(pareto_front([(q["cost"], q["accuracy"]) for q in qs]))
        order = sorted(range(len(qs)), key=lambda i: (qs[i]["cost"], -qs[i]["accuracy"], qs[i]["job"]))
        lines += [f"### {p}", "", "| job | configuration | read | layers run | cost | job cost | accuracy | front |",
                  "|---|---|---|---|---|---|---|---|"]
        for i in order:
            q = qs[i]
            lines.append(f"| {q['job']} | {q['label'].replace('|', chr(92) + '|')} | {q['read']} | {q['layers']} | "
                         f"{q['cost']:.3f} | {q['job_cost']:.3f} | {q['accuracy']:.3f} | "
                         f"{'yes' if i in front else ''} |")
        if p in base:
            lines.append(f"| | TF-IDF + LR (no LLM) | | 0 | 0 | | {base[p]:.3f} | |")
        lines.append("")
    return lines


def plot(pts: dict[str, list[dict[str, Any]]], base: dict[str, float], path: Path) -> Path:
    """One panel per prompt: accuracy against forward cost, the Pareto front as a step line, TF-IDF dashed."""
    plt = _pyplot()
    names = list(pts)
    cols = min(4, len(names))
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows), squeeze=False)
    for ax, p in zip(axes.flat, names):
        qs = pts[p]
        xy = [(q["cost"], q["accuracy"]) for q in qs]
        ax.scatter([a for a, _ in xy], [b for _, b in xy], color="tab:blue", zorder=2, label="job")
        front = pareto_front(xy)
        if front:
            fx, fy = [xy[i][0] for i in front], [xy[i][1] for i in front]
            ax.step(fx, fy, where="post", color="tab:red", zorder=1, label="Pareto front")
            ax.scatter(fx, fy, s=80, facecolors="none", edgecolors="tab:red", zorder=3)
        if p in base:
            ax.axhline(base[p], color="gray", linestyle="--", label=f"TF-IDF {base[p]:.3f}")
        ax.set_xlim(0, 1.05)
        ax.set_title(p, fontsize=10)
        ax.set_xlabel("forward cost (layers run / N)")
        ax.set_ylabel("accuracy")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=7)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.suptitle("accuracy against forward cost, per prompt")
    return saved(fig, path)
