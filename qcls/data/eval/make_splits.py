"""Split the shipped e-commerce set into dev/test deterministically and print its counts (README tables).

The split is a function of the set of labelled queries only, so re-running it on the union of the two
shipped files gives the same two files back:

  python data/eval/make_splits.py              # print the README's count tables for the shipped files
  python data/eval/make_splits.py --check      # exit 1 if the files are not the split of their union
  python data/eval/make_splits.py --source ALL.jsonl --write   # (re)split a labelled file into the two

No model is involved: the labels are read from the files, this only decides which file a line goes to.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPLITS = {"dev": HERE / "ecommerce_dev.jsonl", "test": HERE / "ecommerce_test.jsonl"}
PROMPTS = ["category", "audience", "season", "color", "price", "style", "category_zh", "audience_zh"]
# The zh prompts mirror category/audience one to one, so stratifying on the six English ones is enough.
STRATA = PROMPTS[:6]
CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
LATIN = re.compile(r"[A-Za-z]")


def normalise(query: str) -> str:
    return " ".join(query.casefold().split())


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def split(rows: list[dict]) -> dict[str, list[dict]]:
    """Stratified greedy split in a fixed pseudo-random order (sha256 of the normalised query).

    Each query goes to the split where its labels are rarer so far (each label weighted by 1 / its count
    in the whole set, so rare labels drive the choice), the sizes never differ by more than two."""
    total = Counter((p, r["labels"][p]) for r in rows for p in STRATA)
    order = sorted(rows, key=lambda r: hashlib.sha256(normalise(r["query"]).encode()).hexdigest())
    out: dict[str, list[dict]] = {"dev": [], "test": []}
    seen: dict[str, Counter] = {"dev": Counter(), "test": Counter()}
    for r in order:
        keys = [(p, r["labels"][p]) for p in STRATA]
        n_dev, n_test = len(out["dev"]), len(out["test"])
        if abs(n_dev - n_test) >= 2:
            side = "dev" if n_dev < n_test else "test"
        else:
            score = {s: sum(seen[s][k] / total[k] for k in keys) for s in out}
            side = min(out, key=lambda s: (round(score[s], 9), len(out[s]), s))
        out[side].append(r)
        seen[side].update(keys)
    return out


def write(parts: dict[str, list[dict]]) -> None:
    for name, rows in parts.items():
        lines = [json.dumps({"query": r["query"], "labels": {p: r["labels"][p] for p in PROMPTS}},
                            ensure_ascii=False) for r in rows]
        SPLITS[name].write_text("\n".join(lines) + "\n", encoding="utf-8")


def tables(parts: dict[str, list[dict]]) -> str:
    """The README's counts: queries and CJK share per split, then label counts per prompt per split."""
    allrows = parts["dev"] + parts["test"]
    out = ["| split | queries | with CJK characters | share | of which also Latin letters (mixed) |",
           "|---|---|---|---|---|"]
    for name, rows in [*parts.items(), ("all", allrows)]:
        cjk = [r["query"] for r in rows if CJK.search(r["query"])]
        mixed = sum(bool(LATIN.search(q)) for q in cjk)
        out.append(f"| {name} | {len(rows)} | {len(cjk)} | {len(cjk) / len(rows):.1%} | {mixed} |")
    for p in PROMPTS:
        counts = {s: Counter(r["labels"][p] for r in rows) for s, rows in parts.items()}
        labels = sorted({lab for c in counts.values() for lab in c},
                        key=lambda x: (-sum(c[x] for c in counts.values()), x))
        out += ["", f"**{p}**", "", "| label | dev | test | all |", "|---|---|---|---|"]
        out += [f"| {lab} | {counts['dev'][lab]} | {counts['test'][lab]} | {counts['dev'][lab] + counts['test'][lab]} |"
                for lab in labels]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", type=Path, help="a labelled JSONL to split (default: the union of the splits)")
    ap.add_argument("--write", action="store_true", help="write ecommerce_dev.jsonl / ecommerce_test.jsonl")
    ap.add_argument("--check", action="store_true", help="exit 1 unless the files equal the split of their union")
    args = ap.parse_args(argv)
    shipped = {name: read(path) for name, path in SPLITS.items()} if not args.source else None
    rows = read(args.source) if args.source else shipped["dev"] + shipped["test"]
    parts = split(rows)
    if args.check:
        same = all([r["query"] for r in parts[s]] == [r["query"] for r in shipped[s]] for s in SPLITS)
        print("split is reproducible" if same else "the files are NOT the deterministic split of their union")
        return 0 if same else 1
    if args.write:
        write(parts)
    print(tables(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
