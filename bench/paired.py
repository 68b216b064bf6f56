"""Two configurations timed in alternation in one process, on one random-weight Qwen3 of real shape (GPU).

    python -m bench.paired --model qwen3_4b --a prompts=ecommerce8 \\
        --b "prompts=ecommerce8 calibration=random_head:18:both:scores" --label "a head on layer 18 off / on"
    python -m bench.paired --model qwen3_4b --a prompts=ecommerce8 --b prompts=ecommerce8_fewshot \\
        --label "zero-shot / few-shot"

--a / --b are Hydra overrides (space-separated) on top of the model's config, --common goes to both; both
Classifiers share the loaded weights. `calibration=random_head[:LAYER:READ[:scores]]` stands for a head file
with random weights written here (READ: position, query_mean or both; `scores`: the raw scores as features).
Appends p50/p90 of each side and the median per-pair ratio b/a per batch size to bench/RESULTS.md.
"""
from __future__ import annotations

import sys
import time

from bench import common as C
from bench.latency import QUERIES
from qcls.classifier import Classifier
from qcls.compose import compose
from qcls.heads.head import Read

RANDOM_HEAD = "calibration=random_head"


def base_overrides(model: str) -> list[str]:
    return [f"model={C.family(model)}", f"model.name=random_{model}", "model.source=local", "model.path=random-weights"]


def random_head(overrides: list[str], loaded, seed: int) -> tuple[list[str], str | None]:
    """Replace `calibration=random_head[:LAYER:KIND[:scores]]` by a learned-head file with random weights that
    fits this model (its fingerprints), for the prompts these overrides compose to."""
    spec = next((o for o in overrides if o.startswith(RANDOM_HEAD)), None)
    if spec is None:
        return overrides, None
    rest = [o for o in overrides if o != spec]
    parts = spec.split(":")
    read = Read(int(parts[1]), parts[2]) if len(parts) >= 3 else Read("final")
    with_scores = parts[-1] == "scores"
    path = C.random_head_file(loaded.model, compose(rest), read, with_scores, seed, 0.02, bias_sd=0.5, scores_sd=0.1)
    note = (f"{spec}: {path}, a head with random weights reading {read.kind} at layer {read.layer}"
            f"{' + the raw scores' if with_scores else ''}, not fitted")
    return rest + [f"calibration={path}"], note


def main(argv: list[str] | None = None) -> None:
    ap = C.parser(__doc__)
    ap.add_argument("--model", default="qwen3_4b", choices=C.MODELS)
    ap.add_argument("--a", required=True, help="overrides of configuration a (space-separated)")
    ap.add_argument("--b", required=True, help="overrides of configuration b (space-separated)")
    ap.add_argument("--common", default="", help="overrides for both (e.g. engine.query_buckets=[8,16])")
    ap.add_argument("--label", default=None, help="what the pair compares (the RESULTS.md title)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--iters", type=int, default=200, help="timed requests of each side per batch size")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    base = base_overrides(args.model) + args.common.split()
    sides, notes = {"a": base + args.a.split(), "b": base + args.b.split()}, []
    t0 = time.perf_counter()
    loaded = C.loaded(C.random_qwen3(args.model, *C.device_dtype(), seed=args.seed))
    for name in sides:
        sides[name], note = random_head(sides[name], loaded, args.seed)
        if note:
            notes.append(f"{name}: {note}")
            print(f"bench.paired: {name}: {note}", file=sys.stderr)
    clfs = {k: Classifier(compose(ov), loaded=loaded) for k, ov in sides.items()}
    build_s = time.perf_counter() - t0
    rows = []
    for b in args.batches:
        queries = (QUERIES * b)[:b]
        ta, tb = C.paired_samples(clfs["a"], clfs["b"], queries, args.iters)
        tokens = [c.classify(queries)[0].meta["tokens_per_forward"] for c in (clfs["a"], clfs["b"])]
        rows.append((b, ta, tb, tokens, [stage_medians(c, queries) for c in (clfs["a"], clfs["b"])]))
    report(args, clfs, rows, notes, build_s)


def stage_medians(clf: Classifier, queries: list[str], n: int = 40) -> dict[str, float]:
    """Median ms of each stage over n requests (where a difference between a and b is spent)."""
    runs = [clf.classify(queries)[0].timings_ms for _ in range(n)]
    return {k: C.median([r[k] for r in runs]) for k in ("prepare", "forward", "score", "postprocess")}


def report(args, clfs, rows, notes, build_s) -> None:
    a, b = clfs["a"], clfs["b"]
    label = args.label or f"{args.a} vs {args.b}"
    text = C.header(f"paired: {label} ({args.model} random weights)",
                    f"bench/paired.py --model {args.model} --a \"{args.a}\" --b \"{args.b}\""
                    + (f" --common \"{args.common}\"" if args.common else "") + f" --iters {args.iters}; "
                    f"strategy a/b {a.cfg.strategy}/{b.cfg.strategy}; queries {QUERIES}")
    text += ("| batch | a p50 | a p90 | b p50 | b p90 | median ratio b/a (per pair) | tokens per forward a/b |\n"
             "|---|---|---|---|---|---|---|\n")
    for bsz, ta, tb, tokens, _ in rows:
        ratio = C.median([y / x for x, y in zip(ta, tb)])
        text += (f"| {bsz} | {C.median(ta):.3f} | {C.pct(ta, 0.9):.3f} | {C.median(tb):.3f} | {C.pct(tb, 0.9):.3f} | "
                 f"{ratio:.4f} | {tokens[0]}/{tokens[1]} |\n")
    text += "\nStage medians a / b (ms, 40 more requests each, not alternated):\n\n"
    text += "| batch | prepare | forward | score | postprocess |\n|---|---|---|---|---|\n"
    for bsz, *_, stages in rows:
        text += f"| {bsz} | " + " | ".join(f"{stages[0][k]:.3f} / {stages[1][k]:.3f}"
                                            for k in ("prepare", "forward", "score", "postprocess")) + " |\n"
    meta_a, meta_b = a.metadata(), b.metadata()
    text += (f"\nms per request (classify, results included), {args.iters} pairs per batch size. CUDA graphs a/b: "
             f"{C.n_graphs(a)}/{C.n_graphs(b)}; buckets a/b: {len(meta_a['buckets'])}/{len(meta_b['buckets'])}; "
             f"attention {meta_a['attention']}/{meta_b['attention']}; calibration a/b: {meta_a['calibration']} / "
             f"{meta_b['calibration']}; model + both start-ups {build_s:.1f} s.\n")
    text += "".join(f"- {n}\n" for n in notes + [f"a: {x}" for x in a.notes] + [f"b: {x}" for x in b.notes])
    C.report(text, args.no_append)


if __name__ == "__main__":
    main()
