"""Host stages of the request path (tokenize, prepare, score, postprocess): their p50 per batch size, the
kernels of a forward, and a cProfile of `classify`. Random-weight Qwen3 shapes, real Qwen
tokenizer, ecommerce8 (8 prompts, two with multi-token labels).
On the CPU, `forward` and `score` are the tiny model's own compute (labelled as such). Appends a section to
bench/RESULTS.md.
"""
from __future__ import annotations

import cProfile
import io
import pstats

import torch

from bench import common as C
from bench.latency import QUERIES, make_cfg, prompt_sets
from qcls.classifier import Classifier
from qcls.scoring.tokenization import encode_query

HOST = ("tokenize", "prepare", "score", "postprocess")
EIGHT = "8 prompts (2 Chinese multi-token)"


def forget(clf: Classifier) -> None:
    """Drop what the request path keeps between requests (the query cache, the kept multi-query layouts;
    batch-1 layouts are built at start-up for good): the next request runs as a never-seen batch would."""
    clf.encoder.cache.clear()
    clf.engine.packer._recent.clear()


def stage_p50(clf: Classifier, queries: list[str], iters: int, new: bool = False) -> dict[str, float]:
    """p50 of each stage of `timings_ms` over `iters` requests, and of the host stages' sum; `new`: every
    request as a never-seen one (`forget` before each)."""
    rows = []
    for _ in range(iters):
        if new:
            forget(clf)
        t = clf.classify(queries)[0].timings_ms
        rows.append({**{k: t[k] for k in ("tokenize", "prepare", "forward", "score", "postprocess")},
                     "host": sum(t[k] for k in HOST)})
    return {k: round(C.median([r[k] for r in rows]), 4) for k in rows[0]}


def profile(clf: Classifier, queries: list[str], iters: int, top: int = 25) -> str:
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(iters):
        clf.classify(queries)
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top)
    lines = [x for x in s.getvalue().splitlines() if x.strip()]
    start = next(i for i, x in enumerate(lines) if x.lstrip().startswith("ncalls"))
    return "\n".join(lines[start:start + top + 1])


@torch.inference_mode()
def kernel_tables(clf: Classifier, n: int = 20, top: int = 30) -> str:
    """Device time of a forward + tail at batch 1 and 4: by kind, the non-GEMM share of the GEMMs', top kernels."""
    text = ""
    for b in (1, 4):
        bk = clf.engine.bucket_for([encode_query(clf.tokenizer, q, clf.cfg.max_query_tokens) for q in QUERIES[:b]])

        def run():
            bk.graphs[0].replay() if bk.graphs else bk.forward()
            bk.graphs[1].replay() if bk.graphs else bk.score()
        rows, kinds = [], {}
        for name, us, count in C.kernel_times(run, n):
            kind = C.kernel_kind(name)
            rows.append((us, count, kind, name[:90]))
            kinds[kind] = kinds.get(kind, 0.0) + us / 1e3
        rows.sort(reverse=True)
        gemm = kinds.get("gemm", float("nan"))
        other = sum(v for k, v in kinds.items() if k != "gemm")
        text += (f"\nKernels at batch {b}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in sorted(kinds.items())) +
                 f"; everything but the GEMMs = {100 * other / gemm:.1f} % of the GEMM time\n\n"
                 "| µs / forward | count | kind | kernel |\n|---|---|---|---|\n" +
                 "".join(f"| {us:.1f} | {c:.0f} | {k} | `{name}` |\n" for us, c, k, name in rows[:top]))
    return text


def main() -> None:
    ap = C.parser(__doc__)
    ap.add_argument("--model", default="qwen3_4b", choices=C.MODELS)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--profile-iters", type=int, default=200)
    ap.add_argument("--buckets", type=int, nargs="+", default=[4, 8, 12, 16, 24, 32, 48, 64])
    args = ap.parse_args()
    dev, dtype = C.device_dtype()
    loaded = C.loaded(C.random_model(args.model, dev, dtype))
    clf = Classifier(make_cfg(prompt_sets()[EIGHT], "trie", args.buckets), loaded=loaded)
    kind = "GPU" if dev == "cuda" else "CPU profile (the device is the host: forward/score are CPU compute)"
    text = C.header(f"host stages: {args.model} random weights, ecommerce8 ({kind})",
                    f"bench/host.py --model {args.model} --iters {args.iters} --profile-iters {args.profile_iters}; "
                    f"graphs {clf.engine.graphs}; queries {QUERIES}")
    text += ("| batch | tokenize | prepare | forward | score | postprocess | host stages (tok+prep+score+post) |\n"
             "|---|---|---|---|---|---|---|\n")
    profs = {}
    allocs0 = torch.cuda.memory_stats()["allocation.all.allocated"] if dev == "cuda" else 0
    for b, new in ((1, False), (1, True), (4, False), (4, True)):
        qs = QUERIES[:b]
        p = stage_p50(clf, qs, args.iters, new)
        text += (f"| {b}{', never-seen' if new else ''} | {p['tokenize']:.3f} | {p['prepare']:.3f} | {p['forward']:.3f} | {p['score']:.3f} | "
                 f"{p['postprocess']:.3f} | {p['host']:.3f} |\n")
        if new:
            continue
        profs[b] = profile(clf, qs, args.profile_iters)
    allocs = torch.cuda.memory_stats()["allocation.all.allocated"] - allocs0 if dev == "cuda" else 0
    graphs = sum(len(bk.graphs) for bk in clf.engine.buckets.values() if bk.graphs)
    text += (f"\nms p50 per stage (timings_ms of the results; never-seen: the query cache and the kept multi-query "
             f"layouts emptied before each request). CUDA graphs: {graphs}; CUDA allocations during the "
             f"timed and the profiled requests: {allocs}.\n")
    if dev == "cuda":
        text += kernel_tables(clf)
    for b in (1, 4):
        text += (f"\ncProfile of {args.profile_iters} requests at batch {b}, top functions by own time:\n\n"
                 f"```\n{profs[b]}\n```\n")
    C.report(text, args.no_append)


if __name__ == "__main__":
    main()
