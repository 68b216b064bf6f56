"""This checkout against a base commit's checkout (bench/device.sh MODE@BASE): the JSON of the base run, this
checkout's and the base's again → one table in bench/RESULTS.md, with this checkout's over the base runs' mean.

    python bench/compare.py latency|serving BASE base-1.json new.json base-2.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from bench import common as C


def latency_metrics(raw: dict) -> dict[str, float]:
    """bench/latency.py --json: p50 ms per model, prompt set and batch size."""
    return {f"{model} {label}, b{b} p50 ms": r[f"b{b}_p50"]
            for model, m in raw.items() for label, r in m["engine"].items() for b in (1, 4)}


def serving_metrics(raw: dict) -> dict[str, float]:
    """bench/load.py --json: req/s, p50 and p99 of each HTTP level."""
    return {f"{s['path']} c={s['concurrency']}, {k}": s[k] for s in raw["stats"] if s["path"].startswith("http")
            for k in ("rps", "p50", "p99")}


METRICS = {"latency": latency_metrics, "serving": serving_metrics}


def table(kind: str, runs: list[Path]) -> str:
    got = [METRICS[kind](json.loads(p.read_text())) if p.is_file() else {} for p in runs]
    lines = ["| metric | base | this checkout | base again | this / mean of base |", "|---|---|---|---|---|"]
    for k in dict.fromkeys(k for g in got for k in g):
        a, new, b = (g.get(k) for g in got)
        base = [x for x in (a, b) if x is not None]
        ratio = f"{new / (sum(base) / len(base)):.3f}" if new is not None and base else "–"
        cells = " | ".join("–" if x is None else f"{x:.2f}" for x in (a, new, b))
        lines.append(f"| {k} | {cells} | {ratio} |")
    missing = [p.name for p in runs if not p.is_file()]
    return "\n".join(lines) + "\n" + (f"\nNo result from: {', '.join(missing)} (see its log).\n" if missing else "")


def main(argv: list[str]) -> None:
    kind, base, *runs = argv
    if kind not in METRICS or len(runs) != 3:
        sys.exit(__doc__)
    text = C.header(f"{kind}: this checkout against {base} (base, this, base again; one machine)",
                    f"bench/device.sh {kind}@{base}; each run is that checkout's own bench code")
    C.report(text + table(kind, [Path(r) for r in runs]))


if __name__ == "__main__":
    main(sys.argv[1:])
