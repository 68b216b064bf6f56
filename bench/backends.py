"""One benchmark per backend on the same random-weight Qwen3 checkpoint: GPU memory, start-up time, latency
at batch 1 and 4 (8 prompts), CUDA graphs, and score agreement with the fp16 backend.

    python -m bench.backends                                  # Qwen3-8B shapes, default backend list
    python -m bench.backends fp16 bnb-nf4 gptq:bits=4,kernel=torch --shape qwen3_4b
    python -m bench.backends --tiny                           # CPU, tiny model: checks the script itself

A backend spec is NAME[:key=value,...]: keys go to backend.options, except `bits` / `group` (a GPTQ checkpoint
written by round-to-nearest from the same weights) and dotted keys (Hydra overrides). fp16 runs first as the
reference, without a memory budget; the others under `--budget-gib` (the T4 profile), where a refusal is a
result too; one backend failing is recorded and the rest go on. Appends to bench/RESULTS.md; JSON to $OUT.
"""
from __future__ import annotations

import importlib
import json
import sys
import time
import traceback
from pathlib import Path

import torch

from bench.common import family, free, header, median, parser, pct, random_checkpoint, report, score_diff, scores

DEFAULT = ["fp16", "fp16-offload", "bnb-int8", "bnb-int8:threshold=0", "bnb-nf4"]
QUERIES = ["red summer dress for women", "boys winter hoodie", "cheap black jeans", "vintage trench coat",
           "孕妇连衣裙 夏季", "男童 卫衣 加厚", "premium knit sweater grey", "pink skirt girl",
           "formal white shirt men", "discount sport tee", "女士 风衣 春秋", "street style oversized hoodie",
           "blue denim jacket", "autumn cardigan for pregnant women", "牛仔裤 男士 黑色", "green linen shirt"]


PCRE_SHIM = '''"""Stand-in for pypcre (GPTQModel imports it as a faster `re`; it is a C extension that
needs a compiler and PCRE2 headers to build). Written by bench/backends.py only where pypcre is missing."""
import re
from re import Pattern, escape, split  # noqa: F401


class Flag:
    CASELESS = IGNORECASE = re.IGNORECASE
    MULTILINE = re.MULTILINE
    DOTALL = re.DOTALL
    VERBOSE = EXTENDED = re.VERBOSE
    UNICODE = UTF = re.UNICODE


def compile(pattern, flags=0):  # noqa: A001
    return re.compile(pattern, int(flags))
'''


def ensure_pcre(root: Path) -> str | None:
    """GPTQModel needs `pcre`; fall back to a shim over `re` when pypcre is not installed."""
    try:
        importlib.import_module("pcre")
        return None
    except ImportError:
        shim = root / "pcre-shim"
        shim.mkdir(parents=True, exist_ok=True)
        (shim / "pcre.py").write_text(PCRE_SHIM)
        sys.path.insert(0, str(shim))
        return "pypcre missing: GPTQModel ran with a pcre shim over re"


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    name, _, rest = spec.partition(":")
    return name, dict(kv.split("=", 1) for kv in rest.split(",") if kv)


def run_one(spec: str, model_dir: Path, args, ref) -> dict:
    from qcls.backends import device_memory, memory, sources
    from qcls.classifier import Classifier
    from qcls.config.compose import compose
    name, opts = parse_spec(spec)
    row: dict = {"spec": spec}
    path = model_dir
    hydra = [f"{k}={opts.pop(k)}" for k in [k for k in opts if "." in k]]
    if name == "gptq":
        from qcls.backends.gptq import write_gptq_checkpoint
        shim = ensure_pcre(model_dir.parent)
        if shim:
            row["shim"] = shim
        bits, group = int(opts.pop("bits", 4)), int(opts.pop("group", 128 if not args.tiny else 32))
        path = model_dir.with_name(f"{model_dir.name}-gptq{bits}g{group}")
        if not (path / "config.json").is_file():
            t0 = time.perf_counter()
            write_gptq_checkpoint(model_dir, path, bits, group, device="cuda" if torch.cuda.is_available() else "cpu")
            row["convert_s"] = round(time.perf_counter() - t0, 1)
    over = [f"model={family(args.shape)}", "model.source=local",
            f"model.path={path}", "prompts=ecommerce8", "scoring=trie", f"backend={name}"]
    over += [f"backend.options.{k}={v}" for k, v in opts.items()] + hydra
    if ref is not None and args.budget_gib:
        over.append(f"gpu_memory_gib={args.budget_gib}")
    over += args.override
    try:
        cfg = compose(over)
        t4 = compose([o for o in over if not o.startswith("gpu_memory_gib")] + ["gpu=t4"])
        est = memory.estimate(t4, sources.load_config(sources.resolve(cfg.model, None)), budget=int(15.0 * memory.GIB))
        row.update(est_gib=est.total / memory.GIB, t4_fits=est.total <= est.budget)
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        clf = Classifier(cfg)
        row["startup_s"] = round(time.perf_counter() - t0, 1)
        meta = clf.metadata()
        row.update(graphs=meta.get("graphs"), notes=meta["notes"], memory=meta["memory"],
                   measured_after_startup=device_memory.measured(clf.loaded.device),
                   kernels=sorted({type(m).__name__ for m in clf.loaded.model.model.layers[0].modules()
                                   if "Linear" in type(m).__name__}))
        res = clf.classify(QUERIES)
        bad = [r.error for r in res if r.error]
        if bad:
            raise RuntimeError(f"query errors: {bad[:2]}")
        row["scores"] = scores(res)
        row["tokens_b1"] = clf.classify(QUERIES[:1])[0].meta["tokens_per_forward"]
        for b in (1, 4):
            lat, fwd = [], []
            for k in range(args.iters + 3):
                qs = [QUERIES[(k * b + j) % len(QUERIES)] for j in range(b)]
                t0 = time.perf_counter()
                out = clf.classify(qs)
                dt = (time.perf_counter() - t0) * 1e3
                if k >= 3:
                    lat.append(dt)
                    fwd.append(out[0].timings_ms["forward"])
            row[f"p50_b{b}"], row[f"p90_b{b}"], row[f"fwd_p50_b{b}"] = median(lat), pct(lat, 90), median(fwd)
        row["measured_peak"] = device_memory.measured(clf.loaded.device)
        if ref is not None:
            d = score_diff(row["scores"], ref)
            row["max_delta"], row["winner_agree"] = d["max_abs_diff"], d["winners_equal"]
        del clf, res
    except Exception as e:  # noqa: BLE001 — one backend failing must not stop the others
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:400]}"
        row["traceback"] = traceback.format_exc()[-3000:]
    free()
    return row


def gib(b) -> str:
    return "–" if b is None else f"{b / (1 << 30):.2f}"


def table(rows: list[dict]) -> str:
    out = ["| backend | tokens/fwd b=1 | GPU weights GiB | CPU weights GiB | KV GiB | allocated after start GiB | "
           "peak GiB | device used GiB | est. GiB (T4 fits) | start-up s | p50 / p90 ms b=1 | p50 / p90 ms b=4 | "
           "forward p50 b=1 / b=4 | graphs | max abs Δ score | winners = fp16 | notes / error |",
           "|" + "---|" * 17]
    for r in rows:
        est = f"{r['est_gib']:.2f} ({'yes' if r['t4_fits'] else 'no'})" if "est_gib" in r else "–"
        if "error" in r and "startup_s" not in r:
            out.append(f"| {r['spec']} |  |  |  |  |  |  |  | {est} |  |  |  |  |  |  |  | {r['error']} |")
            continue
        m, ma, mp = r.get("memory", {}), r.get("measured_after_startup", {}), r.get("measured_peak", {})
        extra = ([r["shim"]] if "shim" in r else []) + [f"kernels {r.get('kernels')}"]
        notes = "; ".join(r.get("notes", []) + extra)
        notes += f" ERROR {r['error']}" if "error" in r else ""
        out.append(
            f"| {r['spec']} | {r.get('tokens_b1', '')} | {gib(m.get('weights_gpu'))} | {gib(m.get('weights_cpu'))} | "
            f"{gib(m.get('kv_buffer'))} | {gib(ma.get('gpu_allocated'))} | {gib(mp.get('gpu_peak'))} | "
            f"{gib(mp.get('gpu_used_device'))} | {est} | {r['startup_s']} | {r.get('p50_b1', 0):.1f} / "
            f"{r.get('p90_b1', 0):.1f} | {r.get('p50_b4', 0):.1f} / {r.get('p90_b4', 0):.1f} | "
            f"{r.get('fwd_p50_b1', 0):.1f} / {r.get('fwd_p50_b4', 0):.1f} | {r.get('graphs')} | "
            f"{r.get('max_delta', 0):.4f} | {100 * r.get('winner_agree', 1):.0f}% | {notes[:300]} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__)
    ap.add_argument("backends", nargs="*", default=DEFAULT)
    ap.add_argument("--shape", default="qwen3_8b", choices=["qwen3_8b", "qwen3_4b"])
    ap.add_argument("--tiny", action="store_true", help="CPU, tiny random model: tests the script")
    ap.add_argument("--dir", default="/tmp/qcls-bench", help="where the tiny and GPTQ checkpoints are written")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--budget-gib", type=float, default=15.0, help="gpu_memory_gib for the non-reference rows")
    ap.add_argument("--override", nargs="*", default=[], help="extra Hydra overrides for every backend")
    args = ap.parse_args(argv)
    from qcls.progress import set_quiet
    set_quiet(True)
    root = Path(args.dir)
    t0 = time.perf_counter()
    if args.tiny:
        from qcls.testing.tiny_models import make_tiny_model_dir, tiny_byte_tokenizer
        model_dir = make_tiny_model_dir(root / "tiny-qwen3", "qwen3", tiny_byte_tokenizer())
        args.override += ["engine.query_buckets=[16,32]", "max_query_tokens=32", "engine.warmup_requests=1"]
        args.iters = min(args.iters, 5)
    else:
        model_dir = random_checkpoint(args.shape)
    write_s = time.perf_counter() - t0
    specs = list(dict.fromkeys(["fp16"] + [b for b in args.backends if b != "fp16"]))
    rows, ref = [], None
    for spec in specs:
        t1 = time.perf_counter()
        row = run_one(spec, model_dir, args, ref)
        if spec == "fp16":
            ref = row.get("scores")
            if ref is None:
                print(f"fp16 reference failed: {row.get('error')}", file=sys.stderr)
        row["wall_s"] = round(time.perf_counter() - t1, 1)
        print(json.dumps({k: v for k, v in row.items() if k not in ("scores", "traceback")}, default=str),
              file=sys.stderr, flush=True)
        if "traceback" in row:
            print(row["traceback"], file=sys.stderr)
        rows.append(row)
    shape = "tiny" if args.tiny else args.shape
    text = header(f"Backends: random-weight {shape}, 8 prompts (ecommerce8), scoring=trie",
                  f"shape={shape}, checkpoint written in {write_s:.0f}s, {args.iters} timed requests per batch "
                  f"size, non-reference rows under gpu_memory_gib={args.budget_gib}, overrides={args.override}")
    text += table(rows)
    text += ("\nmax |Δ score| and winners are against the fp16 backend on the same weights and queries "
             f"({len(QUERIES)} queries × 8 prompts); latency is the whole classify() call; random weights give "
             "near-tied labels, so winner agreement understates real-model agreement.\n")
    report(text, args.no_append, "backends", rows)

if __name__ == "__main__":
    main()
