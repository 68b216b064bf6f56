"""What a long prompt costs per request: the prefix-length benchmark (GPU; not a test).

The 8 e-commerce prompts with prefixes of 64, 256, 1k and 2k tokens and with a shared 1k-token block
(bench/prefix_cases.py), each timed in alternation with the 64-token case at batch 1 and 4: the time a longer
prefix adds (median per-pair difference) against the prefix-KV read floor; prefix attention FLOPs, KV memory,
a T4 projection; then `ecommerce8_fewshot` against `ecommerce8`. Appends to bench/RESULTS.md; JSON to $OUT.
"""
from __future__ import annotations

import dataclasses
import time

import torch

from bench import common as C
from bench.latency import QUERIES, make_cfg
from bench.prefix_cases import BASE, attention_flops, kv_read_bytes, prompt_sets
from qcls.classifier import Classifier
from qcls.config.compose import compose
from qcls.engine import tree_plan

T4_FMA = 8.1e12  # fp32 FMA FLOP/s of a T4 (Triton's tl.dot on sm_75: no tensor cores); same 50 % as the GEMMs


def case_numbers(clf: Classifier, model, bw: float) -> dict:
    eng, cfg = clf.engine, model.config
    layers, kv, d, heads = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, cfg.num_attention_heads
    prefix = eng.packer.prefix_len.tolist()[:-1]
    out = {"prefix_tokens": prefix, "pool_slots": eng.pool.n_slots, "kv_read_bytes": kv_read_bytes(eng.pool, layers, kv, d),
           "kv_buffer_bytes": eng.dec.kv_bytes, "floor_ms": kv_read_bytes(eng.pool, layers, kv, d) / bw * 1e3,
           "attention": clf.metadata()["attention"]}
    for b in (1, 4):
        res = clf.classify((QUERIES * b)[:b])
        total = sum(r.query_tokens for r in res)
        out[f"tokens_b{b}"] = res[0].meta["tokens_per_forward"]
        out[f"flops_b{b}"] = attention_flops([total + b * p.const_len for p in eng.prompts], prefix, layers, heads, d)
    return out


def t4_prefix_ms(bytes_: int, flops: int) -> tuple[float, float]:
    """(reading the prefix K/V at 75 % of 320 GB/s, its attention FLOPs at 50 % of the T4's FMA rate), ms."""
    return bytes_ / (C.T4_BW * C.T4_BW_EFF) * 1e3, flops / (T4_FMA * 0.5) * 1e3


def main() -> None:
    ap = C.parser(__doc__)
    ap.add_argument("--model", default="qwen3_4b", choices=sorted(C.SHAPES))
    ap.add_argument("--iters", type=int, default=150, help="pairs timed per case at batch 1 (batch 4: half)")
    ap.add_argument("--buckets", type=int, nargs="+", default=[8, 16, 24, 32],
                    help="engine.query_buckets (the queries land in the same buckets as under the shipped list)")
    ap.add_argument("--longest", type=int, help="only the cases of at most this many prefix tokens (a smoke run)")
    args = ap.parse_args()
    dev, dtype = C.device_dtype()
    bw = C.copy_bandwidth_gbs() * 1e9 if dev == "cuda" else float("nan")
    t0 = time.perf_counter()
    model = C.random_model(args.model, dev, dtype)
    loaded = C.loaded(model)
    lbytes, lparams = C.layer_sizes(model)
    zero = [p.model_dump() for p in compose(["prompts=ecommerce8"]).prompts]
    sets = prompt_sets(loaded.tokenizer, zero, args.longest)
    clfs = {name: Classifier(make_cfg(ps, "trie", args.buckets), loaded=loaded) for name, ps in sets.items()}
    build_s = time.perf_counter() - t0
    rows = {name: case_numbers(clf, model, bw) for name, clf in clfs.items()}
    for name in [n for n in clfs if n != BASE]:
        for b, iters in ((1, args.iters), (4, max(2, args.iters // 2))):
            rows[name][f"b{b}"] = C.paired_p50(clfs[BASE], clfs[name], (QUERIES * b)[:b], iters, lambda x, y: y - x)
    del clfs
    C.free()
    few = [p.model_dump() for p in compose(["prompts=ecommerce8_fewshot"]).prompts]
    a, b_ = (Classifier(make_cfg(ps, "trie", args.buckets), loaded=loaded) for ps in (zero, few))
    fewshot = {}
    for b in (1, 4):
        iters = 2 * args.iters if b == 1 else args.iters
        fewshot[b] = C.paired_p50(a, b_, (QUERIES * b)[:b], iters, lambda x, y: y / x)
    report(args, rows, fewshot, bw, lbytes, lparams, build_s)


def report(args, rows, fewshot, bw, lbytes, lparams, build_s) -> None:
    tun = {d: dataclasses.asdict(t) for d, t in tree_plan.TUNING.items()}
    text = C.header(f"prefix length: what a long prompt costs ({args.model} random weights, 8 prompts, trie)",
                    f"bench/prefix.py --model {args.model} --iters {args.iters} --buckets "
                    f"{' '.join(map(str, args.buckets))}; copy bandwidth {bw / 1e9:.0f} GB/s; "
                    f"kernel shapes d=128: {tun.get(128)}; queries {QUERIES}; model + start-ups {build_s:.0f} s")
    text += ("| case | prefix tokens | prefix K/V read | floor ms | b1 p50 ms (64-token p50) | added b1 | added/floor b1 | "
             "b4 p50 ms (64-token p50) | added b4 | added/floor b4 | prefix attention GFLOP b1 / b4 | KV buffer GB | "
             "T4 projection b1 / b4 (prefix read, FMA b1 / b4) |\n" + "|---" * 13 + "|\n")
    worst = 0.0
    for name, r in rows.items():
        cols = []
        for b in (1, 4):
            if f"b{b}" in r:
                base, mine, added = r[f"b{b}"]
                worst = max(worst, added / r["floor_ms"])
                cols += [f"{mine:.2f} ({base:.2f})", f"{added:.3f}", f"{added / r['floor_ms']:.2f}"]
            else:
                cols += ["", "", ""]
        read, fma1 = t4_prefix_ms(r["kv_read_bytes"], r["flops_b1"])
        _, fma4 = t4_prefix_ms(r["kv_read_bytes"], r["flops_b4"])
        t4 = [C.t4_projection(lbytes, lparams, r[f"tokens_b{b}"]) + max(read, fma) for b, fma in ((1, fma1), (4, fma4))]
        text += (f"| {name} | {max(r['prefix_tokens'])} × {len(r['prefix_tokens'])} ({r['pool_slots']} slots) | "
                 f"{r['kv_read_bytes'] / 1e9:.3f} GB | {r['floor_ms']:.3f} | {' | '.join(cols)} | "
                 f"{r['flops_b1'] / 1e9:.0f} / {r['flops_b4'] / 1e9:.0f} | {r['kv_buffer_bytes'] / 1e9:.2f} | "
                 f"{t4[0]:.1f} / {t4[1]:.1f} ({read:.1f}, {fma1:.1f} / {fma4:.1f}) |\n")
    text += (f"\nAdded = median per-pair difference from the 64-token case (timed in alternation); floor = prefix K/V "
             f"bytes one forward must read (every pool slot once: a shared block counts once) / copy bandwidth. Worst "
             f"added/floor {worst:.2f} (goal ≤ 1.5). T4 projection = bench/latency.py's (weights at 75 % of 320 GB/s, "
             f"GEMM FLOPs at 50 % of 65 TFLOP/s) + the larger of reading the prefix K/V at 75 % of 320 GB/s and the "
             f"prefix attention's FLOPs (query tokens × query heads × prefix keys × 4 × head_dim × layers) at 50 % of "
             f"the T4's 8.1 TFLOP/s fp32 FMA rate (a model, not a measurement).\n\n"
             "`ecommerce8_fewshot` against `ecommerce8` (timed in alternation; p50 ms, median per-pair ratio; goal "
             "≤ 1.03):\n\n| batch | ecommerce8 | ecommerce8_fewshot | ratio |\n|---|---|---|---|\n")
    text += "".join(f"| {b} | {x:.3f} | {y:.3f} | {r:.4f} |\n" for b, (x, y, r) in fewshot.items())
    C.report(text, args.no_append or not torch.cuda.is_available(), "prefix",  # on the CPU a smoke run: no record
             {"rows": rows, "fewshot": fewshot, "copy_gbs": bw / 1e9, "tuning": tun})


if __name__ == "__main__":
    main()
