"""backend=int8 against fp16 on one card: forward and request p50 at 1 and 4 queries, timed in alternation (both
classifiers held, requests interleaved), GPU memory of each alone, score agreement, and the T4 projection.

    python bench/int8.py --shapes qwen3_4b qwen3_8b gemma3_4b
    python bench/int8.py --shapes gemma3_demo --iters 30             # CPU: the default demo as a user runs it
    python bench/int8.py --shapes tiny --iters 3 --no-append        # CPU: checks the script
    python bench/int8.py --shapes qwen3_4b --kernels                 # GPU: where each forward's device time goes

Random weights of the real shapes (bench/common.py): latency depends on shapes, not values; random weights put
labels near ties, so winner agreement is reported, not judged.
"""
from __future__ import annotations

import time

import torch

from bench.common import checkpoint_overrides, free, header, median, parser, report, score_diff, sync
from qcls.check.served import T4_BW, T4_BW_EFF, T4_FLOP_EFF, T4_FLOPS

QUERIES = ["red summer dress for women", "boys winter hoodie", "cheap black jeans", "vintage trench coat",
           "孕妇连衣裙 夏季", "男童 卫衣 加厚", "premium knit sweater grey", "pink skirt girl"]
T4_INT8_OPS = 2 * T4_FLOPS  # 130 TOP/s int8 against 65 TFLOP/s fp16, at the same efficiency


def scores(results) -> list:
    """[query][prompt][label]: the label scores, or the heads' logits where the forward stops at their layer."""
    return [[[lab.score if lab.score is not None else lab.head_score for lab in p.labels] for p in r.prompts]
            for r in results]


def t4_ms(params: int, tokens: int, int8: bool, moved: int = 0) -> float:
    """The T4 model of docs/design.md §8 for `params` layer parameters: bytes at 1 (int8) or 2 (fp16) a weight,
    plus `moved` bytes of activations."""
    nbytes = params * (1 if int8 else 2) + moved
    rate = (T4_INT8_OPS if int8 else T4_FLOPS) * T4_FLOP_EFF
    return (nbytes / (T4_BW * T4_BW_EFF) + 2 * params * tokens / rate) * 1e3


def build(shape: str, backend: str, extra: list[str]):
    from qcls.backends.device_memory import measured
    from qcls.classifier import Classifier
    from qcls.config.compose import compose
    over = overrides(shape)  # a random checkpoint is written (on the GPU) before the peak is reset: not the load's
    free()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if torch.cuda.is_available() else 0
    t0 = time.perf_counter()
    prompts = [] if shape in DEMOS else ["prompts=ecommerce8", "scoring=trie"]
    steps = Classifier.in_steps(compose(over + prompts + [f"backend={backend}"] + extra))
    rises, top = [], 0  # the build's steps in which the allocator's peak rose (a T4 must hold each)
    while True:
        try:
            name = next(steps)
        except StopIteration as done:
            clf = done.value
            break
        peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
        if peak > top:
            rises.append(f"{name[:60]} {peak / 2**30:.2f}")
            top = peak
    mem = measured(clf.loaded.device) or {}
    held = (torch.cuda.memory_allocated() - before) if torch.cuda.is_available() else 0
    return clf, {"startup_s": round(time.perf_counter() - t0, 1), "held_gib": held / 2**30,
                 "peak_gib": mem.get("gpu_peak", 0) / 2**30, "peak_steps": rises[-3:], "notes": clf.notes}


DEMOS = ("gemma3_demo", "smollm2_demo")  # real weights, their own prompts and default head (the forward's exit)


def overrides(shape: str) -> list[str]:
    if shape in DEMOS:
        return [f"model={shape}"]
    if shape != "tiny":
        return checkpoint_overrides(shape)
    from pathlib import Path

    from qcls.testing.tiny_models import make_tiny_model_dir, tiny_byte_tokenizer
    d = make_tiny_model_dir(Path("/tmp/qcls-bench/tiny-qwen3"), "qwen3", tiny_byte_tokenizer())
    return ["model=qwen3_4b", "model.source=local", f"model.path={d}", "model.head=null", "max_query_tokens=32",
            "engine.query_buckets=[16,32]", "engine.warmup_requests=1"]


def alternate(a, b, batch: int, iters: int) -> dict:
    """Requests of a and b interleaved: per side the request and forward-stage p50 (ms), and the median ratio b / a."""
    out = {k: [] for k in ("a_req", "b_req", "a_fwd", "b_fwd")}
    for k in range(iters + 3):
        qs = [QUERIES[(k * batch + j) % len(QUERIES)] for j in range(batch)]
        for side, clf in (("a", a), ("b", b)):
            sync()
            t0 = time.perf_counter()
            res = clf.classify(qs)
            sync()
            if k >= 3:
                out[f"{side}_req"].append((time.perf_counter() - t0) * 1e3)
                out[f"{side}_fwd"].append(res[0].timings_ms["forward"])
    return {"fp16_req": median(out["a_req"]), "int8_req": median(out["b_req"]), "fp16_fwd": median(out["a_fwd"]),
            "int8_fwd": median(out["b_fwd"]),
            "fwd_ratio": median([y / x for x, y in zip(out["a_fwd"], out["b_fwd"])]),
            "req_ratio": median([y / x for x, y in zip(out["a_req"], out["b_req"])]),
            "tokens": res[0].meta.get("tokens_per_forward")}


def moved_per_token(layer, int8: bool) -> int:
    """Activation bytes a layer moves per token that the weight-only model leaves out: each GEMM's input written
    and read (2 bytes a value in fp16, 1 in int8) and its output written and read (2 in fp16, int8's int32 4)."""
    a, m = layer.self_attn, layer.mlp
    ins = a.q_proj.in_features + a.o_proj.in_features + m.gate_proj.in_features + m.down_proj.in_features
    outs = sum(x.out_features for x in (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj))
    return 2 * (ins * (1 if int8 else 2) + outs * (4 if int8 else 2))


def run(shape: str, iters: int, kernels: bool = False) -> dict:
    q8, m8 = build(shape, "int8", [])  # alone first: its memory without fp16 beside it
    fp, m16 = build(shape, "fp16", [])
    row = {"shape": shape, "int8": m8, "fp16": m16}
    d = score_diff(scores(q8.classify(QUERIES)), scores(fp.classify(QUERIES)))
    row["max_delta"], row["winners_equal"] = d["max_abs_diff"], d["winners_equal"]
    params = sum(p.numel() for p in fp.loaded.model.model.layers.parameters())  # as loaded: the exit's layers
    for b in (1, 4):
        r = alternate(fp, q8, b, iters)
        r["t4_fp16"], r["t4_int8"] = t4_ms(params, r["tokens"] or 0, False), t4_ms(params, r["tokens"] or 0, True)
        r["t4_int8_half"] = t4_ms(params // 2, r["tokens"] or 0, True)  # a head at half depth (layer 18 of 36)
        layers, tok = fp.loaded.model.model.layers, r["tokens"] or 0
        r["t4_moved"] = [t4_ms(params // d, tok, i8, len(layers) // d * tok * moved_per_token(layers[0], i8))
                         for i8, d in ((False, 1), (True, 1), (True, 2))]
        row[f"b{b}"] = r
    if kernels and torch.cuda.is_available():  # the kernels of one forward + tail, each backend (bench/host.py's table)
        from bench.host import kernel_tables
        row["kernels"] = {"fp16": kernel_tables(fp, top=15), "int8": kernel_tables(q8, top=15)}
    del q8, fp
    free()
    return row


def table(rows: list[dict]) -> str:
    out = ["| model | queries | tokens | forward p50 fp16 / int8 ms (ratio) | request p50 fp16 / int8 ms (ratio) | "
           "T4 projection fp16 / int8 / int8 at half depth ms | the same with the activations' bytes | GPU GiB held fp16 / "
           "int8 | start-up s fp16 / int8 | max \\|Δ score\\| / winners = fp16 |", "|" + "---|" * 10]
    for r in rows:
        for b in (1, 4):
            x = r[f"b{b}"]
            out.append(f"| {r['shape']} | {b} | {x['tokens']} | {x['fp16_fwd']:.2f} / {x['int8_fwd']:.2f} "
                       f"({x['fwd_ratio']:.3f}) | {x['fp16_req']:.2f} / {x['int8_req']:.2f} ({x['req_ratio']:.3f}) | "
                       f"{x['t4_fp16']:.1f} / {x['t4_int8']:.1f} / {x['t4_int8_half']:.1f} | "
                       f"{' / '.join(f'{v:.1f}' for v in x['t4_moved'])} | "
                       f"{r['fp16']['held_gib']:.2f} / {r['int8']['held_gib']:.2f} | {r['fp16']['startup_s']} / "
                       f"{r['int8']['startup_s']} | {r['max_delta']:.3f} / {100 * r['winners_equal']:.0f} % |")
    notes = [f"- {r['shape']}: {n}" for r in rows for n in r["int8"]["notes"] if n.startswith("int8:")]
    notes += [f"- {r['shape']}, {b}: GPU GiB held {r[b]['held_gib']:.2f}, peak {r[b]['peak_gib']:.2f}; the build's steps "
              f"that raised the peak (last 3, GiB after): {'; '.join(r[b]['peak_steps'])}" for r in rows
              for b in ("fp16", "int8") if r[b]["peak_steps"]]
    return "\n".join(out + [""] + notes) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__)
    ap.add_argument("--shapes", nargs="+", default=["qwen3_4b", "qwen3_8b", "gemma3_4b"])
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--kernels", action="store_true", help="GPU: each backend's device time by kernel at 1 and 4 queries")
    args = ap.parse_args(argv)
    from qcls.progress import set_quiet
    set_quiet(True)
    rows = []
    for s in args.shapes:
        rows.append(run(s, args.iters, args.kernels))
        print({k: v for k, v in rows[-1].items() if k != "kernels"}, flush=True)
    text = header("int8 (W8A8) against fp16, alternated on one card: random weights, ecommerce8, scoring=trie",
                  f"shapes={args.shapes}, {args.iters} timed requests per side and batch size, interleaved")
    kernels = "".join(f"\n### {r['shape']}, {b}: the kernels of one forward + tail\n{t}" for r in rows
                      for b, t in r.get("kernels", {}).items())
    report(text + table(rows) + kernels, args.no_append, "int8", rows)


if __name__ == "__main__":
    main()
