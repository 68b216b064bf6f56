"""HTTP throughput of two checkouts, run in turn in one lease (bench/accept_gpu.sh http): the bench/load.py JSONs
named http-base-N.json and http-new-N.json → one table (req/s, p50, p99, mean batch per run) and new / base per
pair, as Markdown for bench/RESULTS.md.

    python bench/http_ab.py OUT/http-*.json
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def main(paths: list[str]) -> str:
    runs = {}
    for p in sorted(paths):
        m = re.search(r"http-(base|new)-(\d+)\.json$", p)
        if not m:
            continue
        stats = [s for s in json.loads(Path(p).read_text())["stats"] if s["path"].startswith("http")]
        if stats:
            runs[(m.group(1), int(m.group(2)))] = stats[-1]
    lines = ["| run | req/s | p50 ms | p99 ms | mean queries per forward | errors |", "|---|---|---|---|---|---|"]
    for (side, n), s in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        lines.append(f"| {side} {n} | {s['rps']:.1f} | {s['p50']:.2f} | {s['p99']:.2f} | {s['batch']:.2f} | "
                     f"{s['errors']} |")
    base = [s["rps"] for (side, _), s in runs.items() if side == "base"]
    new = [s["rps"] for (side, _), s in runs.items() if side == "new"]
    if base and new:
        lines.append("")
        lines.append(f"new / mean of the base runs, req/s: {sum(new) / len(new) / (sum(base) / len(base)):.3f}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(main(sys.argv[1:]))
