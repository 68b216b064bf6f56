"""`qcls label-next`: the queries of a pool most worth labelling next for the head being improved, written as a
labelled-set CSV to fill in (the rule: qcls/fitting/label_next.py; the pool: qcls/bulk/pool.py)."""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from qcls.config.compose import ConfigError
from qcls.fitting.label_next import COVERAGE, SIMILARITY

DEFAULT_OUT = "label_next.csv"
EPILOG = """examples:
  qcls label-next queries.txt -n 20                          # the demo model with its head, its prompts
  qcls label-next logs/ calibration=heads/mine.yaml --labelled labelled.csv --out batch2.csv
  qcls label-next bulk_out.parquet --column q prompts=ecommerce8 --prompt audience --hint
  qcls label-next logs/ --by-frequency --json > picks.jsonl

POOL: a prediction-log folder (its *.jsonl / *.parquet parts), a `qcls bulk` output, or any query file (.txt one
query a line; .csv, .tsv, .jsonl, .parquet with a `query` column or --column NAME). Every distinct query is one
candidate (case and whitespace do not make another) with the number of rows that asked it; those in --labelled
are left out. The model runs with the head it is given (calibration=FILE, else the model's own for the prompts
it was fitted for), as `qcls classify` would, and gives per candidate every label's probability and the state
the head reads.

The rule: per prompt the margin p1 - p2 between the two most probable labels; a query's margin is the smallest
over the prompts (--prompt NAME: that prompt's). A prompt without a head in the file (none fitted yet, or too few
labels to fit one: `qcls calibrate --method head` needs --cv-folds, 3, queries of every label) is ranked by its
LLM label scores' softmax, what qcls answers with for it, and its state is the final norm's output at the read
position. Taken in order of margin (smallest first; --by-frequency: (1 - margin) x log(1 + count)), skipping a
query whose state has cosine similarity >= --similarity with one already picked (states standardised per feature
over the pool and the labelled queries); --coverage of the batch goes to queries far from every labelled one
(farthest-first over the states). Output: a CSV with `query`, one empty column per prompt to fill in (what
`qcls calibrate --eval` reads), then `count`, `why` and with --hint `hint:<prompt>` (the model's guess: it biases
whoever labels, so it is off by default). An existing output file is never overwritten. See
docs/evaluation.md, "Choosing what to label"."""


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="qcls label-next", epilog=EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 description="Choose the N queries of POOL most worth labelling for the head being "
                                             "improved and write them as a CSV to fill in; key=value arguments are "
                                             "Hydra overrides.")
    ap.add_argument("-n", type=int, default=20, metavar="N", help="how many queries (default 20)")
    ap.add_argument("--labelled", metavar="FILE", help="the queries labelled so far (JSONL, CSV or TSV, as "
                    "`qcls calibrate --eval` reads): left out of the pool, and the places --coverage keeps away from")
    ap.add_argument("--out", metavar="FILE.csv", help=f"default {DEFAULT_OUT}; refused if it exists")
    ap.add_argument("--json", action="store_true", help="one JSON object per picked query on stdout")
    ap.add_argument("--hint", action="store_true", help="add the model's guess per prompt (hint:<prompt> columns)")
    ap.add_argument("--by-frequency", action="store_true", help="weigh uncertainty by log(1 + times asked)")
    ap.add_argument("--prompt", metavar="NAME", help="rank by this prompt's margin alone")
    ap.add_argument("--similarity", type=float, default=SIMILARITY, metavar="S", help="no two picks whose states' "
                    f"cosine similarity is >= S (default {SIMILARITY})")
    ap.add_argument("--coverage", type=float, default=COVERAGE, metavar="F", help="share of the batch for queries "
                    f"far from every labelled one (default {COVERAGE})")
    ap.add_argument("--column", metavar="NAME", help="the pool file's query column (default: query)")
    ap.add_argument("items", nargs="*", metavar="POOL|OVERRIDE")
    return ap


def check_options(args: argparse.Namespace, cfg) -> Path:
    """Refuse bad options before anything is read; the output path."""
    if args.n < 1:
        raise ConfigError(f"-n {args.n}: choose at least one query")
    if not 0 <= args.coverage <= 1:
        raise ConfigError(f"--coverage {args.coverage}: a share of the batch, 0 to 1")
    if not 0 < args.similarity <= 1:
        raise ConfigError(f"--similarity {args.similarity}: a cosine similarity above 0, at most 1")
    names = [p.name for p in cfg.prompts]
    if args.prompt is not None and args.prompt not in names:
        raise ConfigError(f"--prompt {args.prompt}: not a prompt of this config ({names})")
    out = Path(args.out or DEFAULT_OUT)
    if out.suffix.lower() != ".csv":
        raise ConfigError(f"--out {out}: the picks are written as CSV", "name the file FILE.csv")
    if out.exists():
        raise ConfigError(f"{out} exists: label-next never overwrites a file (it may hold labels)",
                          "give another --out, or move that file away first")
    if args.labelled and not Path(args.labelled).is_file():
        raise ConfigError(f"--labelled {args.labelled}: no such file", "give the JSONL, CSV or TSV file of the "
                          "queries labelled so far, or leave --labelled out")
    return out


def run(args: argparse.Namespace, overrides: list[str], pool_arg: str) -> dict[str, Any]:
    from qcls.config.compose import compose
    from qcls.eval.dataset import load_eval_set
    from qcls.fitting.label_next import Candidates, choose
    from qcls.bulk.pool import normalised, read_pool

    cfg = compose(overrides)
    out = check_options(args, cfg)
    pool = read_pool(pool_arg, args.column)
    labelled = load_eval_set(args.labelled, cfg.prompts) if args.labelled else None
    done = {normalised(q) for q in labelled.queries} if labelled else set()
    cand = [(q, c) for q, c in zip(pool.queries, pool.counts) if normalised(q) not in done]
    if not cand:
        raise ConfigError(f"every query of the pool {pool.path} ({len(pool.queries)} distinct) is already in "
                          f"{args.labelled}: nothing is left to label", "give a pool with queries not labelled yet "
                          "(a newer log or a larger file)")
    if args.n > len(cand):
        raise ConfigError(f"-n {args.n}: the pool {pool.path} has {len(cand)} queries not labelled yet",
                          f"give -n {len(cand)} or fewer, or a larger pool")
    reference = labelled.queries if labelled is not None and args.coverage > 0 else []
    got = _read(classifier(cfg), [q for q, _ in cand] + list(reference))
    keep = [i for i in range(len(cand)) if got["ok"][i]]
    if len(keep) < args.n:
        raise ConfigError(f"-n {args.n}: only {len(keep)} of the pool's {len(cand)} candidates could be classified "
                          f"(the others: {got['errors'][:2]})",
                          f"give -n {len(keep)} or fewer, or raise max_query_tokens")
    ref_rows = [len(cand) + i for i in range(len(reference)) if got["ok"][len(cand) + i]]
    c = Candidates([cand[i][0] for i in keep], np.array([cand[i][1] for i in keep], dtype=np.float64),
                   {p: v[keep] for p, v in got["probs"].items()}, got["labels"], got["served_by"],
                   got["states"][keep])
    picks = choose(c, args.n, got["states"][ref_rows] if ref_rows else None, prompt=args.prompt,
                   similarity=args.similarity, coverage=args.coverage, by_frequency=args.by_frequency)
    rows = [{"query": c.queries[pk.index], "count": int(c.counts[pk.index]), "kind": pk.kind, "why": pk.why,
             "margins": pk.margins,
             **({"hint": {p: c.labels[p][int(np.argmax(c.probs[p][pk.index]))] for p in c.probs}} if args.hint else {})}
            for pk in picks]
    _write(out, rows, [p.name for p in cfg.prompts], args.hint)
    return {"file": str(out), "pool": str(pool.path), "kind": pool.kind, "rows": pool.rows, "skipped": pool.skipped,
            "distinct": len(pool.queries), "labelled": len(pool.queries) - len(cand), "candidates": len(keep),
            "refused": len(cand) - len(keep), "served_by": got["served_by"], "picks": rows}


def classifier(cfg):
    """The config's Classifier, as it serves (its head, its layer exit), keeping the final state too where a
    prompt has no head on a state (its LLM scores read that one)."""
    from qcls.classifier import Classifier
    from qcls.heads.head import FINAL, Read
    from qcls.heads.startup import choose
    head = choose(cfg).head
    need_final = any(head is None or not _reads_state(head, p.name) for p in cfg.prompts)
    return Classifier(cfg, taps=Read(FINAL, "position").taps if need_final else [])


def _reads_state(head, prompt: str) -> bool:
    ph = head.prompts.get(prompt)
    return ph is not None and ph.read is not None


def _read(clf, queries: list[str]) -> dict[str, Any]:
    """One pass of the model over `queries` (the engine's batched forwards, as a head is fitted: read_states):
    per prompt the probabilities qcls answers with, who gives them, and the unit states (label_next.unit_states)."""
    from qcls.fitting import heads as H
    from qcls.fitting.label_next import unit_states
    from qcls.heads.head import FINAL, Read
    results, states = clf.read_states(queries)
    ok = [r.ok for r in results]
    good = [i for i, k in enumerate(ok) if k]
    if not good:
        raise ConfigError(f"no query of the pool could be classified ({results[0].error})", "raise max_query_tokens")
    stacked = np.stack([states[i].numpy() for i in good])  # [n, taps, prompts, H]
    taps = list(clf.engine.taps)
    probs, labels, served, blocks = {}, {}, {}, []
    for j, name in enumerate(clf.prompt_names):
        headed = clf.head is not None and _reads_state(clf.head, name)
        read = clf.head.prompts[name].read if headed else Read(FINAL, "position")
        if not all(t in taps for t in read.taps):
            raise ConfigError(f"prompt {name!r}: the model's default head was dropped at start-up, so its state "
                              "was not kept", "run again with calibration=null, or name a head file")
        blocks.append(H.features(stacked[:, :, j], taps, read, None))
        full = np.zeros((len(queries), len(results[good[0]].prompts[j].labels)))
        full[good] = [[ls.prob for ls in results[i].prompts[j].labels] for i in good]
        probs[name] = full
        labels[name] = [ls.label for ls in results[good[0]].prompts[j].labels]
        served[name] = f"head ({read.kind} @ layer {read.layer})" if headed else \
            ("calibration" if clf.head is not None and name in clf.head.prompts else "LLM label scores")
    unit = np.zeros((len(queries), sum(b.shape[1] for b in blocks)))
    unit[good] = unit_states(blocks)
    return {"ok": ok, "errors": [r.error for r in results if not r.ok], "probs": probs, "labels": labels,
            "served_by": served, "states": unit}


def _write(out: Path, rows: list[dict], prompts: list[str], hint: bool) -> None:
    """The CSV to fill in; created exclusively, so a file that appeared meanwhile is not overwritten either."""
    out.parent.mkdir(parents=True, exist_ok=True)
    head = ["query", *prompts, "count", "why"] + ([f"hint:{p}" for p in prompts] if hint else [])
    with out.open("x", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(head)
        for r in rows:
            w.writerow([r["query"], *[""] * len(prompts), r["count"], r["why"]]
                       + ([r["hint"][p] for p in prompts] if hint else []))


def summary(res: dict[str, Any]) -> str:
    served = "; ".join(f"{p}: {s}" for p, s in res["served_by"].items())
    kinds = [r["kind"] for r in res["picks"]]
    return (f"pool {res['pool']} ({res['kind']}): {res['rows']} rows, {res['distinct']} distinct queries"
            + (f", {res['skipped']} rows without a query" if res["skipped"] else "")
            + f"; {res['labelled']} already labelled; {res['candidates']} candidates"
            + (f" ({res['refused']} refused by the classifier)" if res["refused"] else "")
            + f"\nranked by: {served}\npicked {len(kinds)}: {kinds.count('uncertainty')} by margin, "
              f"{kinds.count('coverage')} for coverage\nwrote {res['file']}: fill in the prompt columns")


def main(argv: list[str] | None = None) -> int:
    from qcls.config.overrides import split_args
    from qcls.eval.dataset import DatasetError
    ap = build_parser()
    args = ap.parse_intermixed_args(list(sys.argv[1:] if argv is None else argv))  # overrides among options
    stray, overrides = split_args(args.items)
    if len(stray) != 1:
        ap.error(f"give one POOL (a log folder or a query file) and key=value overrides, got {stray or 'no POOL'}")
    try:
        res = run(args, overrides, stray[0])
    except (ConfigError, DatasetError, ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"qcls label-next: error: {e}", file=sys.stderr)
        return 2
    width = max(len(r["why"]) for r in res["picks"])
    for k, r in enumerate(res["picks"], 1):
        line = f"{k:>3}  {r['why']:<{width}}  {r['query']}"
        print(json.dumps({"rank": k, **r}, ensure_ascii=False) if args.json else line)
    print(summary(res), file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
