"""What the forward costs when it stops at a head's layer: the forward stage against the depth run.

    python bench/layer_exit.py --models qwen3_4b gemma3_4b            # GPU: Qwen3-4B at 9/18/27/36, Gemma3-4B at 17/34
    python bench/layer_exit.py --models tiny --depths 1 2 --iters 3 --no-append   # CPU smoke
    python bench/layer_exit.py --demo gemma3_demo smollm2_demo --iters 20             # CPU: the demos' speed-up

Per model and depth L: a random-weight model of real shape built with its first L layers only (what a backend
loads for a head at layer L: qcls/backends/partial.py), the real Qwen tokenizer, prompts=ecommerce8 and a head
with random weights reading the read position after layer L (L = the whole depth: a head on the final state, the
full forward with its final norm and label rows). Every depth has its own Classifier, all alive at once and timed
in alternation (a, b, c, d, a, …) so a drifting machine hits them alike. Per depth: the forward stage's p50 (device
time, CUDA events) at batch 1 and 4 against the goal L/N × the full forward's + 0.15 ms, request p50, tokens per
forward, CUDA allocations during the timed requests, GPU memory allocated by the model and its start-up, and the T4
projection of the layers run (bench/common.py).
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import common as C  # noqa: E402
from qcls.backends import partial  # noqa: E402
from qcls.backends.base import LoadedModel, module_bytes  # noqa: E402
from qcls.classifier import Classifier  # noqa: E402
from qcls.compose import compose  # noqa: E402
from qcls.heads.head import FINAL, Read  # noqa: E402
from qcls.qwen_tokenizer import build_qwen_tokenizer  # noqa: E402

QUERIES = ["mens slim fit jeans", "夏季女士碎花连衣裙", "boys hoodie with zip", "red knit maternity dress"]
DEPTHS = {"qwen3_4b": [9, 18, 27, 36], "qwen3_8b": [10, 20, 36], "gemma3_4b": [17, 34], "tiny": [1, 2],
          "gemma3_tiny": [1, 3]}
SLACK_MS = 0.15


def model_with_layers(name: str, layers: int, dev: str, dtype: torch.dtype):
    """The shape `name` built with its first `layers` layers, carrying what a truncated load carries."""
    full = C.model_config(name)
    cut = partial.truncated_config(full, layers) if layers < full.num_hidden_layers else copy.deepcopy(full)
    model = C.random_model(cut, dev, dtype)
    if layers < full.num_hidden_layers:
        setattr(model, partial.ATTR, partial.Truncation(layers, full.num_hidden_layers, full))
    return model


def build(name: str, layers: int, total: int, tok, dev: str, dtype: torch.dtype, buckets: list[int]):
    """(Classifier, bytes allocated by the model and its start-up) for one depth."""
    C.free()
    before = torch.cuda.memory_allocated() if dev == "cuda" else 0
    model = model_with_layers(name, layers, dev, dtype)
    loaded = LoadedModel(model, tok, torch.device(dev), dtype, "fp16", memory=module_bytes(model))
    over = ["model=qwen3_4b", f"model.name=random_{name}", "model.source=local", "model.path=random-weights",
            "prompts=ecommerce8", f"engine.query_buckets=[{','.join(map(str, buckets))}]"]
    head = C.random_head_file(model, compose(over), Read(layers if layers < total else FINAL, "position"), False,
                              seed=0, scale=0.02, bias_sd=0.5)
    clf = Classifier(compose(over + [f"calibration={head}"]), loaded=loaded)
    assert clf.depth.layers == layers, clf.depth
    return clf, (torch.cuda.memory_allocated() - before) if dev == "cuda" else module_bytes(model).get("weights_cpu", 0)


def measure(name: str, depths: list[int], iters: int, tok, dev: str, dtype: torch.dtype, buckets: list[int]) -> dict:
    total = C.model_config(name).num_hidden_layers
    built = {L: build(name, L, total, tok, dev, dtype, buckets) for L in depths}
    fwd: dict[tuple[int, int], list[float]] = {}
    req: dict[tuple[int, int], list[float]] = {}
    allocs = {L: 0 for L in depths}
    for b in (1, 4):
        for L, (clf, _) in built.items():  # warm, then timed in alternation
            clf.classify(QUERIES[:b])
        for _ in range(iters):
            for L, (clf, _) in built.items():
                a0 = torch.cuda.memory_stats()["allocation.all.allocated"] if dev == "cuda" else 0
                r = clf.classify(QUERIES[:b])[0]
                if dev == "cuda":
                    allocs[L] += torch.cuda.memory_stats()["allocation.all.allocated"] - a0
                fwd.setdefault((L, b), []).append(r.timings_ms["forward"])
                req.setdefault((L, b), []).append(r.timings_ms["total"])
    rows = {}
    for L, (clf, mem) in built.items():
        lay = clf.loaded.model.model.layers
        lbytes, lparams = C.layer_bytes(clf.loaded.model), C.layer_params(clf.loaded.model)
        tok_b = {b: clf.classify(QUERIES[:b])[0].meta["tokens_per_forward"] for b in (1, 4)}
        rows[L] = {"layers": len(lay), "allocs": allocs[L], "memory_gib": mem / 2**30,
                   "forward": {b: C.median(fwd[(L, b)]) for b in (1, 4)},
                   "request": {b: C.median(req[(L, b)]) for b in (1, 4)}, "tokens": tok_b,
                   "t4_ms": {b: C.t4_projection(lbytes, lparams, tok_b[b]) for b in (1, 4)},
                   "graphs": clf.engine.graphs}
    full = rows[max(depths)]["forward"] if max(depths) == total else None
    for L, row in rows.items():
        row["goal_ms"] = {b: L / total * full[b] + SLACK_MS for b in (1, 4)} if full else None
    return {"total": total, "rows": rows}


def report(name: str, res: dict, iters: int, dtype: torch.dtype) -> str:
    total = res["total"]
    lines = [f"| layers run | share | forward p50 b1 / b4 (ms) | goal L/N × full + {SLACK_MS} (ms) | met | request p50 "
             "b1 / b4 | tokens b1 / b4 | allocations during requests | GPU memory from the model and start-up (GiB) | "
             "T4 projection b1 / b4 (ms) |", "|" + "---|" * 10]
    for L, r in sorted(res["rows"].items()):
        f, g = r["forward"], r["goal_ms"]
        met = "—" if g is None else ("yes" if all(f[b] <= g[b] for b in (1, 4)) else "**no**")
        goal = "—" if g is None else f"{g[1]:.3f} / {g[4]:.3f}"
        lines.append(f"| {L} of {total} | {L / total:.2f} | {f[1]:.3f} / {f[4]:.3f} | {goal} | {met} | "
                     f"{r['request'][1]:.3f} / {r['request'][4]:.3f} | {r['tokens'][1]} / {r['tokens'][4]} | "
                     f"{r['allocs']} | {r['memory_gib']:.2f} | {r['t4_ms'][1]:.1f} / {r['t4_ms'][4]:.1f} |")
    return (C.header(f"Layer exit: the forward against the depth run, {name} (random weights, {str(dtype)[6:]}), "
                     "ecommerce8",
                     f"prompts=ecommerce8, a random head at the read position after L layers (L = {total}: the final "
                     f"state, the whole forward), {iters} requests per depth and batch size in alternation")
            + "\n".join(lines) + "\n\nT4 projection: the layers run only (bench/common.py's model).\n")


def demo(name: str, iters: int) -> str:
    """A demo model with its shipped head, the exit on against off, timed in alternation (the CPU demo's speed-up)."""
    on = Classifier(compose([f"model={name}"]))
    off = Classifier(compose([f"model={name}", "engine.layer_exit=false"]))
    rows = []
    for b in (1, 4):
        t = {"on": [], "off": []}
        for clf in (on, off):
            clf.classify(QUERIES[:b])
        for _ in range(iters):
            for key, clf in (("on", on), ("off", off)):
                t[key].append(clf.classify(QUERIES[:b])[0].timings_ms)
        med = {k: {s: C.median([x[s] for x in v]) for s in ("forward", "total")} for k, v in t.items()}
        rows.append(f"| {b} | {med['off']['forward']:.1f} / {med['on']['forward']:.1f} | "
                    f"{med['off']['forward'] / med['on']['forward']:.2f}× | {med['off']['total']:.1f} / "
                    f"{med['on']['total']:.1f} | {med['off']['total'] / med['on']['total']:.2f}× |")
    d = on.depth
    return (C.header(f"Layer exit on the {name} demo with its head: every layer against {d.layers} of {d.total}",
                     f"model={name}, its default head and prompts, {iters} requests per batch size in alternation; "
                     f"{d.reason}")
            + "| batch | forward p50, every layer / the exit (ms) | speed-up | request p50 (ms) | speed-up |\n"
            + "|---|---|---|---|---|\n" + "\n".join(rows) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["qwen3_4b", "gemma3_4b"], choices=sorted(DEPTHS))
    ap.add_argument("--depths", type=int, nargs="+", default=None, help="layers to run (default per model)")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--buckets", type=int, nargs="+", default=[4, 8, 12, 16, 24, 32, 48, 64])
    ap.add_argument("--no-append", action="store_true", help="print only; do not append to bench/RESULTS.md")
    ap.add_argument("--demo", nargs="+", default=None, metavar="MODEL",
                    help="instead: demo models (gemma3_demo, smollm2_demo) with their heads, the exit on against off")
    args = ap.parse_args()
    if args.demo:
        for name in args.demo:
            C.report(demo(name, args.iters), args.no_append)
        return
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if dev == "cuda" else torch.float32
    tok = build_qwen_tokenizer()
    for name in args.models:
        res = measure(name, args.depths or DEPTHS[name], args.iters, tok, dev, dtype, args.buckets)
        C.report(report(name, res, args.iters, dtype), args.no_append)
        C.free()


if __name__ == "__main__":
    main()
