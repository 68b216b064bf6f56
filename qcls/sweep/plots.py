"""The report's plots (matplotlib, Agg backend, PNG): accuracy against latency with the Pareto front, and a
reliability diagram."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from qcls.eval import metrics


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")  # files only; never a window, also on a machine with a display
    import matplotlib.pyplot as plt
    return plt


def saved(fig, path: Path) -> Path:
    """The figure laid out, written to `path` and closed (every report figure ends so)."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats (latency x lower-or-equal and accuracy y higher-or-equal,
    one of them strictly), ordered by latency."""
    front = []
    for i, (x, y) in enumerate(points):
        if not any((x2 <= x and y2 >= y) and (x2 < x or y2 > y) for x2, y2 in points):
            front.append(i)
    return sorted(front, key=lambda i: points[i])


def accuracy_latency(rows: list[dict[str, Any]], path: Path) -> Path:
    """Mean accuracy against p50 latency at batch 1, every ok job, the Pareto front marked."""
    plt = _pyplot()
    rows = [r for r in rows if r.get("b1_p50_ms") is not None and r.get("mean_accuracy") is not None]
    pts = [(float(r["b1_p50_ms"]), float(r["mean_accuracy"])) for r in rows]
    front = pareto_front(pts)
    fig, ax = plt.subplots(figsize=(7.5, 5))
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], color="tab:blue", zorder=2, label="job")
    if front:
        fx, fy = [pts[i][0] for i in front], [pts[i][1] for i in front]
        ax.step(fx, fy, where="post", color="tab:red", zorder=1, label="Pareto front")
        ax.scatter(fx, fy, s=90, facecolors="none", edgecolors="tab:red", zorder=3)
    xr = (max(p[0] for p in pts) - min(p[0] for p in pts)) or 1.0
    yr = (max(p[1] for p in pts) - min(p[1] for p in pts)) or 1.0
    for i, ((x, y), r) in enumerate(zip(pts, rows)):
        # labels of nearby points are stacked instead of printed over each other
        near = sum(abs(x - x2) < 0.25 * xr and abs(y - y2) < 0.04 * yr for x2, y2 in pts[:i])
        ax.annotate(r["label"], (x, y), textcoords="offset points", xytext=(4, 4 - 10 * near), fontsize=7)
    ax.set_xlabel("p50 latency, one query per request (ms)")
    ax.set_ylabel("mean accuracy over prompts")
    ax.set_title("accuracy against latency")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    return saved(fig, path)


def learning_curve(rows: list[dict[str, Any]], path: Path) -> Path:
    """Held-out mean accuracy against the number of fitting queries, one line per job with a curve; `all` is
    drawn at the largest size's double (its own count differs by prompt) and labelled."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    ticks: dict[float, str] = {}
    for r in rows:
        pts = {k[6:-1]: v for k, v in r.items() if k.startswith("curve[") and v is not None}
        if not pts:
            continue
        sizes = sorted(int(k) for k in pts if k != "all")
        xs = [float(n) for n in sizes] + ([2.0 * (sizes[-1] if sizes else 1)] if "all" in pts else [])
        ys = [pts[str(n)] for n in sizes] + ([pts["all"]] if "all" in pts else [])
        ax.plot(xs, ys, marker="o", label=r["label"])
        ticks.update({float(n): str(n) for n in sizes})
        if "all" in pts:
            ticks[xs[-1]] = "all"
    ax.set_xscale("log")
    ax.set_xticks(list(ticks), list(ticks.values()))
    ax.minorticks_off()
    ax.set_xlabel("labelled fitting queries per prompt")
    ax.set_ylabel("held-out mean accuracy over prompts")
    ax.set_title("learning curve of the head")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=7)
    return saved(fig, path)


def pooled(predictions: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """(winner probability, correct) of every (query, prompt) with a gold label in predictions.jsonl rows."""
    conf, correct = [], []
    for row in predictions:
        for p in row["prompts"].values():
            if p.get("gold") is None:
                continue
            probs = p["probs"]
            conf.append(max(probs.values()))
            correct.append(float(p["winner"] == p["gold"]))
    return np.asarray(conf), np.asarray(correct)


def reliability(predictions: list[dict[str, Any]], path: Path, title: str) -> Path:
    """Accuracy per bin of the winner's probability (15 bins), pooled over the job's prompts."""
    plt = _pyplot()
    conf, correct = pooled(predictions)
    r = metrics.binned(conf, correct)
    e = metrics.binned_ece(conf, correct)
    edges = r["edges"]
    width = edges[1] - edges[0]
    used = r["count"] > 0
    fig, (ax, axn) = plt.subplots(2, 1, figsize=(6, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ax.bar(edges[:-1][used], r["accuracy"][used], width=width, align="edge", edgecolor="black",
           color="tab:blue", alpha=0.8, label="accuracy")
    ax.plot([0, 1], [0, 1], "--", color="gray", label="perfect calibration")
    ax.scatter(r["confidence"][used], r["accuracy"][used], color="tab:red", s=12, zorder=3,
               label="mean confidence")
    ax.set_ylabel("accuracy in bin")
    ax.set_title(f"reliability ({title}); pooled ECE {e:.3f}", fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    axn.bar(edges[:-1], r["count"], width=width, align="edge", edgecolor="black", color="tab:gray")
    axn.set_xlabel("winner's probability")
    axn.set_ylabel("queries")
    return saved(fig, path)
