"""The report's "Abstention" section (from the jobs' `coverage` blocks, qcls/sweep/coverage.py): at the
thresholds of a job's head file, per prompt the coverage, the precision of the answered queries and the share
of errors avoided beside the TF-IDF baseline answering as many; the precision–coverage curve of the best job
as a table and a plot."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from qcls.sweep.report_baselines import dig


def _f(v: Any) -> str:
    return "" if v is None else f"{v:.3f}"


def row_fields(result: dict[str, Any]) -> dict[str, Any]:
    """summary.csv columns: per prompt with a threshold its coverage and the precision of the answered."""
    out = {}
    for p, b in (dig(result, "coverage", "per_prompt") or {}).items():
        at = b.get("at_threshold")
        if at:
            out[f"coverage[{p}]"], out[f"answered_precision[{p}]"] = at["coverage"], at["precision"]
    return out


def _ci(block: dict[str, Any], key: str, where: str | None = None) -> str:
    """'0.921 [0.867, 0.954] n=152' from a share and its interval (the share alone where none was recorded)."""
    iv = block.get(where) if where else dig(block, "intervals", key)
    if not iv or block.get(key) is None:
        return _f(block.get(key))
    return f"{_f(block[key])} [{iv['low']:.3f}, {iv['high']:.3f}] n={iv['n']}"


def section(ok: list[dict[str, Any]], by_job: dict[str, Any], out_dir: Path) -> tuple[list[str], dict[str, Path]]:
    """Markdown lines and the plot written (empty when no job has a coverage block). `ok`: the report's rows
    of successful jobs, best first; `by_job`: row job → Job."""
    jobs = [(x, by_job[x["job"]].result["coverage"]) for x in ok if by_job[x["job"]].result.get("coverage")]
    if not jobs:
        return [], {}
    lines = ["", "## Abstention: precision against coverage", ""]
    fitted = [(x, c) for x, c in jobs if any(b.get("at_threshold") for b in c["per_prompt"].values())]
    if fitted:
        lines += ["At the thresholds of each job's head file (fitted on the fitting split: `qcls calibrate "
                  "--target-precision`), on this split: the share of queries answered, the precision of those, the "
                  "share of the errors (wrong winners when answering every query) avoided, and the TF-IDF baseline "
                  "answering the same share of queries (its most confident ones); shares with their 95 % Wilson "
                  "interval and n. A target precision certified at a confidence is `met` on this split, `within` "
                  "the promise (below the target, but by no more than that confidence allows) or `broken`.", "",
                  "| job | prompt | target | threshold | coverage | precision answered | promise | errors avoided | "
                  "accuracy, all answered | TF-IDF precision at that coverage |", "|---" * 10 + "|"]
        for x, c in fitted:
            for p, b in c["per_prompt"].items():
                at = b.get("at_threshold")
                if not at:
                    continue
                target = at["fitted"].get("target_precision", at["fitted"].get("target_coverage"))
                kind = "precision" if "target_precision" in at["fitted"] else "coverage"
                conf = at["fitted"].get("confidence")
                lines.append(f"| {x['job']} | {p} | {f'{kind} {target}' if target is not None else ''}"
                             f"{f' at {conf:.0%}' if conf and kind == 'precision' else ''} | "
                             f"{at['threshold']:.4f} | {_ci(at, 'coverage')} | {_ci(at, 'precision')} | "
                             f"{dig(at, 'promise', 'verdict') or ''} | {_f(at['errors_avoided'])} | "
                             f"{_ci(b, 'accuracy', 'accuracy_interval')} | {_f(dig(at, 'tfidf', 'precision'))} |")
    x, c = jobs[0]
    levels = c["levels"]
    lines += ["", f"Precision of the answered queries at each coverage (the highest threshold answering at least "
                  f"that share), best job `{x['job']}` ({x['label']}; {c.get('probabilities', '')} probabilities), "
                  "beside the TF-IDF baseline's:", "",
              "| prompt | " + " | ".join(f"{float(lv):.0%}" for lv in levels) + " |", "|---" * (len(levels) + 1) + "|"]
    for p, b in c["per_prompt"].items():
        lines.append(f"| {p} | " + " | ".join(_f(b["precision_at_coverage"][lv]) for lv in levels) + " |")
        if b.get("tfidf_precision_at_coverage"):
            lines.append(f"| {p} (TF-IDF) | " + " | ".join(_f(b["tfidf_precision_at_coverage"][lv]) for lv in levels)
                         + " |")
    image = plot(c, out_dir / "precision_coverage.png", f"best job: {x['label']}")
    return lines, {"precision_coverage": image}


def plot(c: dict[str, Any], path: Path, title: str) -> Path:
    """Per prompt precision against coverage; the fitted threshold's point marked."""
    from qcls.sweep.plots import _pyplot, saved
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 5))
    for p, b in c["per_prompt"].items():
        line, = ax.plot(b["curve"]["coverage"], b["curve"]["precision"], label=p, drawstyle="steps-post")
        at = b.get("at_threshold")
        if at and at["answered"]:
            ax.scatter([at["coverage"]], [at["precision"]], color=line.get_color(), zorder=3)
            ax.annotate(f"t={at['threshold']:.2f}", (at["coverage"], at["precision"]), textcoords="offset points",
                        xytext=(4, -10), fontsize=7)
    ax.set_xlabel("coverage (share of queries answered)")
    ax.set_ylabel("precision of the answered")
    ax.set_xlim(0, 1.02)
    ax.set_title(f"precision against coverage ({title})")
    ax.grid(alpha=0.3)
    ax.legend()
    return saved(fig, path)
