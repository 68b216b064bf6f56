"""Latency of the fast engine on random-weight Qwen3 and Gemma3 shapes (GPU; not a test).

Real Qwen tokenizer; the prompt sets: 2 zero-shot (`prompts=default`), 8 e-commerce (`prompts=ecommerce8`, two
with Chinese multi-token labels) and the same 8 with single-token labels. Appends a section to bench/RESULTS.md.
"""
from __future__ import annotations

import json
import operator
import time

import torch

from bench import common as C
from qcls.classifier import Classifier
from qcls.config.compose import compose, validate
from qcls.testing.qwen_tokenizer import build_qwen_tokenizer

QUERIES = ["women's summer floral midi dress", "mens slim fit jeans", "夏季女士碎花连衣裙", "boys hoodie size 140"]
EN = {"category_zh": ["dress", "jeans", "shirt", "trench", "skirt", "tee", "hoodie", "knit", "other", "none"],
      "audience_zh": ["boy", "girl", "man", "woman", "pregnant", "none"]}
TWO = "2 prompts (prompts=default, zero-shot)"


def prompt_sets() -> dict[str, list[dict]]:
    default = [p.model_dump() for p in compose(["prompts=default"]).prompts]
    eight = [p.model_dump() for p in compose(["prompts=ecommerce8"]).prompts]
    single = [{**p, "labels": EN.get(p["name"], p["labels"])} for p in eight]
    return {TWO: default, "8 prompts (2 Chinese multi-token)": eight, "8 prompts single-token": single}


def make_cfg(prompts: list[dict], strategy: str, buckets: list[int]):
    return validate({"model": {"name": "random", "source": "local", "path": "/random-weights"}, "prompts": prompts,
                     "scoring": {"name": strategy}, "max_query_tokens": buckets[-1],
                     "engine": {"query_buckets": buckets, "max_batch_size": 4, "warmup_requests": 2}})


def bench_engine(loaded, prompts, strategy, buckets, iters, reference: bool):
    """Numbers of one configuration (with `reference`, its scores against the fp16 reference engine's), and its
    Classifier (kept for the paired comparisons)."""
    t0 = time.perf_counter()
    clf = Classifier(make_cfg(prompts, strategy, buckets), loaded=loaded)
    startup = time.perf_counter() - t0
    t1 = time.perf_counter()
    first = clf.classify(QUERIES[:1])[0]
    first_ms = (time.perf_counter() - t1) * 1e3
    allocs = torch.cuda.memory_stats()["allocation.all.allocated"] if torch.cuda.is_available() else 0
    b1 = C.timed(lambda: clf.classify(QUERIES[:1]), iters)
    b4 = C.timed(lambda: clf.classify(QUERIES[:4]), iters)
    allocs = (torch.cuda.memory_stats()["allocation.all.allocated"] - allocs) if torch.cuda.is_available() else 0
    stages = {}
    for _ in range(10):
        r = clf.classify(QUERIES[:1])[0]
        for k, v in r.timings_ms.items():
            stages.setdefault(k, []).append(v)
    r4 = clf.classify(QUERIES[:4])[0]
    out = {"startup_s": round(startup, 2), "startup_phases": clf.startup_s, "first_ms": first_ms,
           "b1_p50": C.median(b1), "b1_p90": C.pct(b1, 90), "b4_p50": C.median(b4), "b4_p90": C.pct(b4, 90),
           "tokens_b1": first.meta["tokens_per_forward"], "tokens_b4": r4.meta["tokens_per_forward"],
           "stages": {k: round(C.median(v), 3) for k, v in stages.items()}, "graphs": clf.engine.graphs,
           "allocs_during_requests": allocs, "prefix_cache": clf.metadata()["prefix_cache"],
           "attention": clf.metadata().get("attention")}
    if reference:
        cfg = make_cfg(prompts, strategy, buckets)
        ref = Classifier(cfg.model_copy(update={"engine": cfg.engine.model_copy(update={"kind": "reference"})}),
                         loaded=loaded)
        d = C.score_diff(*([C.scores(c.classify([q]))[0] for q in QUERIES[:2]] for c in (clf, ref)))
        out.update(ref_max_abs_diff=d["max_abs_diff"], ref_winners_same=f"{d['winners_equal'] * d['n']:.0f}/{d['n']}")
        del ref
    return out, clf


def main() -> None:
    ap = C.parser(__doc__)
    ap.add_argument("--models", nargs="+", default=["qwen3_4b", "qwen3_8b"], choices=C.MODELS,
                    help="random-weight shapes; gemma3_* use the Qwen tokenizer (token counts, not the Gemma vocabulary)")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--buckets", type=int, nargs="+", default=[4, 8, 12, 16, 24, 32, 48, 64])
    ap.add_argument("--no-reference", action="store_true", help="skip the fp16 reference comparison")
    ap.add_argument("--json", default=None, help="also write raw numbers here")
    args = ap.parse_args()
    dev, dtype = C.device_dtype()
    tok = build_qwen_tokenizer()
    bw = C.copy_bandwidth_gbs() if dev == "cuda" else float("nan")
    raw = {}
    for name in args.models:
        t0 = time.perf_counter()
        model = C.random_model(name, dev, dtype)
        build_s = time.perf_counter() - t0
        loaded = C.loaded(model, tok)
        lbytes, lparams = C.layer_sizes(model)
        floor = lbytes / (bw * 1e9) * 1e3 if dev == "cuda" else float("nan")
        res, kept = {}, {}
        for label, prompts in prompt_sets().items():
            res[label], clf = bench_engine(loaded, prompts, "trie", args.buckets, args.iters, not args.no_reference)
            if label.startswith("8 prompts"):
                kept[label] = clf
            del clf
            C.free()
        m8, s8 = kept["8 prompts (2 Chinese multi-token)"], kept["8 prompts single-token"]
        pairs = {"multi / single, b1": C.paired_p50(m8, s8, QUERIES[:1], 2 * args.iters, operator.truediv),
                 "multi / single, b4": C.paired_p50(m8, s8, QUERIES[:4], args.iters, operator.truediv)}
        del kept, s8, m8
        C.free()
        raw[name] = {"engine": res, "layer_bytes": lbytes, "floor_ms": floor,
                     "copy_gbs": bw, "build_s": build_s, "pairs": pairs}
        report(name, res, pairs, lbytes, lparams, floor, bw, args)
        del model, loaded
        C.free()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1, default=str)


def report(name, res, pairs, lbytes, lparams, floor, bw, args) -> None:
    text = C.header(f"latency: {name} random weights, fp16, scoring=trie",
                    f"bench/latency.py --models {name} --iters {args.iters} --buckets {' '.join(map(str, args.buckets))}; "
                    f"attention {res[TWO]['attention']}; CUDA graphs; "
                    f"queries {QUERIES}")
    text += (f"Layer weights {lbytes / 1e9:.2f} GB; copy bandwidth {bw:.0f} GB/s; floor {floor:.2f} ms.\n\n"
             "| prompts | b1 p50 | b1 p90 | b4 p50 | b4 p90 | tokens b1/b4 | ratio to floor (b1) | first request | "
             "T4 projection b1 / b4 |\n|---|---|---|---|---|---|---|---|---|\n")
    for label, r in res.items():
        text += (f"| {label} | {r['b1_p50']:.2f} | {r['b1_p90']:.2f} | {r['b4_p50']:.2f} | {r['b4_p90']:.2f} | "
                 f"{r['tokens_b1']}/{r['tokens_b4']} | {r['b1_p50'] / floor:.1f}× | {r['first_ms']:.2f} | "
                 f"{C.t4_projection(lbytes, lparams, r['tokens_b1']):.1f} / {C.t4_projection(lbytes, lparams, r['tokens_b4']):.1f} |\n")
    multi = res["8 prompts (2 Chinese multi-token)"]
    text += "\nPaired runs (the two configurations timed in alternation in one process; p50 ms each, median of the " \
            "per-pair ratios):\n\n| pair | p50 a | p50 b | ratio |\n|---|---|---|---|\n"
    text += "".join(f"| {k} | {a:.2f} | {b:.2f} | {r:.3f} |\n" for k, (a, b, r) in pairs.items())
    text += (f"\nChecks: multi-token / single-token (8 prompts, b1, paired) = {pairs['multi / single, b1'][2]:.3f} "
             f"(target ≤ 1.10); b4 / b1 (8 prompts) = {multi['b4_p50'] / multi['b1_p50']:.2f} (target ≤ 1.5); "
             f"first request / p50 = {multi['first_ms'] / multi['b1_p50']:.2f} (target ≤ 1.2); "
             f"CUDA allocations during timed requests: {sum(r['allocs_during_requests'] for r in res.values())}.\n\n")
    for label, r in res.items():
        diff = (f"; vs fp16 reference: max |Δ score| {r['ref_max_abs_diff']:.4f}, winners same {r['ref_winners_same']}"
                if "ref_max_abs_diff" in r else "")
        text += (f"- {label}: stages ms (b1 median) {r['stages']}; start-up {r['startup_s']} s "
                 f"{r['startup_phases']}; prefix cache {r['prefix_cache']}{diff}\n")
    C.report(text, args.no_append)


if __name__ == "__main__":
    main()
