"""The report's "Baselines per prompt" section: per prompt the majority class and the TF-IDF baseline
(qcls/fitting/baseline.py) beside the best job's accuracy with raw scores and with its head or calibration, and
which one wins. One table per baseline source (the splits it was fitted and scored on)."""
from __future__ import annotations

from typing import Any


def dig(d: Any, *path: str) -> Any:
    """d[path[0]][path[1]]…, or None where a level is missing (result.json files of older or failed jobs)."""
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)
    return d


def _f(v: Any) -> str:
    return "" if v is None else f"{v:.3f}"


def _ci(v: float | None, n: int) -> str:
    """A share of n with its 95 % Wilson interval: '0.733 [0.556, 0.858]'."""
    from qcls.heads.bounds import wilson
    if v is None or not n or abs(v * n - round(v * n)) > 1e-6:  # not a share of these n (scored on others)
        return _f(v)
    lo, hi = wilson(int(round(v * n)), n)
    return f"{v:.3f} [{lo:.3f}, {hi:.3f}]"


def _best(ok: list[dict[str, Any]], key: str) -> tuple[float | None, str]:
    got = [(x[key], x["job"]) for x in ok if x.get(key) is not None]
    if not got:
        return None, ""
    v, job = max(got, key=lambda t: t[0])
    return v, job


def section(ok: list[dict[str, Any]], by_job: dict[str, Any]) -> list[str]:
    """Markdown lines (empty when no job has a baseline). `ok`: the report's rows of successful jobs;
    `by_job`: row job → Job (its result)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for x in ok:
        b = by_job[x["job"]].result.get("baseline")
        if b:
            groups.setdefault(b["source"], []).append(x)
    lines: list[str] = []
    for source, rows in groups.items():
        b = by_job[rows[0]["job"]].result["baseline"]
        lines += ["", f"## Baselines per prompt ({source})", "",
                  f"{b['method']}; C chosen by {b['folds']}-fold cross-validation on the fitting split, as a head's. "
                  "`LLM` columns: the best job of this table (its job folder in brackets), raw scores and with its "
                  "head or calibration. `winner`: the higher accuracy. Accuracies with their 95 % Wilson interval over "
                  "the n queries.", ""]
        lines += ["| prompt | n | majority acc | TF-IDF acc | TF-IDF macro-F1 | LLM acc, raw | LLM acc, head/cal | "
                  "winner |", "|---|---|---|---|---|---|---|---|"]
        for p, v in b["per_prompt"].items():
            raw, raw_job = _best(rows, f"accuracy[{p}]")
            cal, cal_job = _best(rows, f"cal_accuracy[{p}]")
            base = v.get("accuracy")
            llm = max((a for a in (raw, cal) if a is not None), default=None)
            if base is None or llm is None:
                winner = v.get("error", "")
            else:
                winner = "TF-IDF" if base > llm else "tie" if base == llm else "LLM"
            n = v.get("n", 0)
            lines.append(f"| {p} | {n} | {_f(v.get('majority_accuracy'))} | {_ci(base, n)} | "
                         f"{_f(v.get('macro_f1'))} | {_ci(raw, n)}{f' ({raw_job})' if raw_job else ''} | "
                         f"{_ci(cal, n)}{f' ({cal_job})' if cal_job else ''} | {winner} |")
    return lines
