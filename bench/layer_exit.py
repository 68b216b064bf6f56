"""What the forward costs when it stops at a head's layer (docs/design.md §11); `--demo MODEL …`: a demo model with
its shipped head instead, the exit on against off (CPU).

Per depth L: a random-weight model of real shape built with its first L layers only (what a backend loads for a head
at layer L), the real Qwen tokenizer, prompts=ecommerce8 and a random head on the read position after layer L (L =
the whole depth: a head on the final state, the full forward). Every depth has its own Classifier, all timed in
alternation. Per depth: the forward stage's p50 (device time) at batch 1 and 4 against L/N × the full forward's
+ 0.15 ms, request p50, tokens per forward, CUDA allocations during the timed requests, GPU memory allocated by the
model and its start-up, and the T4 projection of the layers run.
"""
from __future__ import annotations

import torch

from bench import common as C
from qcls.backends import partial
from qcls.backends.base import LoadedModel, module_bytes
from qcls.classifier import Classifier
from qcls.config.compose import compose
from qcls.heads.head import FINAL, Read
from qcls.testing.qwen_tokenizer import build_qwen_tokenizer

QUERIES = ["mens slim fit jeans", "夏季女士碎花连衣裙", "boys hoodie with zip", "red knit maternity dress"]
DEPTHS = {"qwen3_4b": [9, 18, 27, 36], "qwen3_8b": [10, 20, 36], "gemma3_4b": [17, 34], "tiny": [1, 2]}
SLACK_MS = 0.15


def build(name: str, layers: int, tok, dev: str, dtype: torch.dtype, buckets: list[int]):
    """(Classifier, bytes its model and start-up allocated) of `name` built with its first `layers` layers."""
    C.free()
    before = torch.cuda.memory_allocated() if dev == "cuda" else 0
    whole = C.model_config(name)
    total = whole.num_hidden_layers
    model = C.random_model(partial.truncated_config(whole, layers), dev, dtype)
    if layers < total:  # what a truncated load attaches
        setattr(model, partial.ATTR, partial.Truncation(layers, total, whole))
    over = ["model=qwen3_4b", f"model.name=random_{name}", "model.source=local", "model.path=random-weights",
            "prompts=ecommerce8", f"engine.query_buckets=[{','.join(map(str, buckets))}]",
            f"max_query_tokens={max(buckets)}"]
    head = C.random_head_file(model, compose(over), Read(layers if layers < total else FINAL, "position"), False,
                              seed=0, scale=0.02, bias_sd=0.5)
    clf = Classifier(compose(over + [f"calibration={head}"]),
                     loaded=LoadedModel(model, tok, torch.device(dev), dtype, "fp16", memory=module_bytes(model)))
    assert clf.depth.layers == layers, clf.depth
    return clf, (torch.cuda.memory_allocated() - before if dev == "cuda" else module_bytes(model)["weights_cpu"])


def alternate(clfs: dict, iters: int) -> dict:
    """Per (key, batch) the requests' timings_ms, the Classifiers timed in turn; and CUDA allocations per key."""
    out, allocs = {}, {k: 0 for k in clfs}
    for b in (1, 4):
        for clf in clfs.values():
            clf.classify(QUERIES[:b])
        for _ in range(iters):
            for k, clf in clfs.items():
                a0 = torch.cuda.memory_stats()["allocation.all.allocated"] if torch.cuda.is_available() else 0
                out.setdefault((k, b), []).append(clf.classify(QUERIES[:b])[0])
                if torch.cuda.is_available():
                    allocs[k] += torch.cuda.memory_stats()["allocation.all.allocated"] - a0
    return {"results": out, "allocs": allocs}


def p50(rs, stage: str) -> float:
    return C.median([r.timings_ms[stage] for r in rs])


def depths(name: str, ls: list[int], iters: int, tok, dev: str, dtype: torch.dtype, buckets: list[int]) -> str:
    total = C.model_config(name).num_hidden_layers
    built = {L: build(name, L, tok, dev, dtype, buckets) for L in ls}
    t = alternate({L: c for L, (c, _) in built.items()}, iters)
    res = t["results"]
    full = {b: p50(res[(total, b)], "forward") for b in (1, 4)} if total in ls else None
    rows = []
    for L, (clf, mem) in sorted(built.items()):
        f = {b: p50(res[(L, b)], "forward") for b in (1, 4)}
        goal = {b: L / total * full[b] + SLACK_MS for b in (1, 4)} if full else None
        tokens = {b: res[(L, b)][0].meta["tokens_per_forward"] for b in (1, 4)}
        lb, lp = C.layer_sizes(clf.loaded.model)
        met = "—" if goal is None else "yes" if all(f[b] <= goal[b] for b in (1, 4)) else "**no**"
        rows.append(f"| {L} of {total} | {L / total:.2f} | {f[1]:.3f} / {f[4]:.3f} | "
                    + ("—" if goal is None else f"{goal[1]:.3f} / {goal[4]:.3f}") + f" | {met} | "
                    f"{p50(res[(L, 1)], 'total'):.3f} / {p50(res[(L, 4)], 'total'):.3f} | {tokens[1]} / {tokens[4]} | "
                    f"{t['allocs'][L]} | {mem / 2**30:.2f} | {C.t4_projection(lb, lp, tokens[1]):.1f} / "
                    f"{C.t4_projection(lb, lp, tokens[4]):.1f} |")
    return (C.header(f"Layer exit: the forward against the depth run, {name} (random weights, {str(dtype)[6:]}), "
                     "ecommerce8", f"a random head at the read position after L layers (L = {total}: the final "
                     f"state, the whole forward), {iters} requests per depth and batch size in alternation")
            + f"| layers run | share | forward p50 b1 / b4 (ms) | goal L/N × full + {SLACK_MS} (ms) | met | request "
            "p50 b1 / b4 | tokens b1 / b4 | allocations during requests | GPU memory from the model and start-up "
            "(GiB) | T4 projection of the layers run, b1 / b4 (ms) |\n" + "|---" * 10 + "|\n" + "\n".join(rows) + "\n")


def demo(name: str, iters: int) -> str:
    """A demo model with its shipped head, the exit on against off, in alternation (the CPU demo's speed-up)."""
    on = Classifier(compose([f"model={name}"]))
    res = alternate({"off": Classifier(compose([f"model={name}", "engine.layer_exit=false"])), "on": on},
                    iters)["results"]
    rows = [f"| {b} | " + " | ".join(f"{p50(res[('off', b)], s):.1f} / {p50(res[('on', b)], s):.1f} | "
                                     f"{p50(res[('off', b)], s) / p50(res[('on', b)], s):.2f}×"
                                     for s in ("forward", "total")) + " |" for b in (1, 4)]
    return (C.header(f"Layer exit on the {name} demo with its head: every layer against {on.depth.layers} of "
                     f"{on.depth.total}", f"its default head and prompts, {iters} requests per batch size in "
                     f"alternation; {on.depth.reason}")
            + "| batch | forward p50, every layer / the exit (ms) | speed-up | request p50 (ms) | speed-up |\n"
            + "|---" * 5 + "|\n" + "\n".join(rows) + "\n")


def main() -> None:
    ap = C.parser(__doc__)
    ap.add_argument("--models", nargs="+", default=["qwen3_4b", "gemma3_4b"], choices=sorted(DEPTHS))
    ap.add_argument("--depths", type=int, nargs="+", default=None, help="layers to run (default: per model)")
    ap.add_argument("--demo", nargs="+", default=None, metavar="MODEL", help="demo models with their heads instead")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--buckets", type=int, nargs="+", default=[4, 8, 12, 16, 24, 32, 48, 64])
    args = ap.parse_args()
    dev, dtype = C.device_dtype()
    tok = None if args.demo else build_qwen_tokenizer()
    for name in args.demo or args.models:
        C.report(demo(name, args.iters) if args.demo else
                 depths(name, args.depths or DEPTHS[name], args.iters, tok, dev, dtype, args.buckets), args.no_append)
        C.free()


if __name__ == "__main__":
    main()
