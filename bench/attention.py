"""The tree-attention kernels per prefix length against the prefix-KV read floor, and the sweep that picks
their shapes and split rule (GPU; not a test).

    python -m bench.attention                          # the shipped shapes (tree_plan.tuning_for)
    python -m bench.attention --sweep --out-tuning T   # + candidates; prints the best, writes it to T (JSON)
    python -m bench.attention --smoke --sweep          # CPU, Triton interpreter, tiny heads: checks the script

One forward's attention (36 layers, each with its own K/V, captured in one CUDA graph) for Qwen3-4B/8B
heads (32 query / 8 KV heads, d=128) over the engine's own packing (Packer, bucket, plan) of the
prefix-length cases (bench/prefix_cases.py) and the e-commerce prompt sets, batch 1 and 4. Every timed
configuration is checked against dense masked SDPA on one layer first; the sweep is bench/attention_sweep.py.
Gemma3 head shapes (d=256; 4 query / 1 KV head, 8 / 4) with its 5:1 local/global window pattern are
checked and timed last. Appends to bench/RESULTS.md; JSON to $OUT.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

if "--smoke" in sys.argv:  # before Triton is imported: the kernels then run in its interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from bench import common as C  # noqa: E402
from bench.attention_sweep import _short, sweep  # noqa: E402
from bench.latency import QUERIES  # noqa: E402
from bench.prefix_cases import BASE, attention_flops, kv_read_bytes, prompt_sets  # noqa: E402
from qcls.compose import compose  # noqa: E402
from qcls.config import PromptSpec  # noqa: E402
from qcls.engine import attention as A  # noqa: E402
from qcls.engine.bucket import token_buckets  # noqa: E402
from qcls.engine.layout import Packer, PromptLayout, build_mask, unpack  # noqa: E402
from qcls.engine.prefix_cache import plan_prefixes  # noqa: E402
from qcls.engine.qkv_kernels import rope_torch  # noqa: E402
from qcls.engine.tree_plan import Tuning, plan_tree, tuning_for  # noqa: E402
from qcls.qwen_tokenizer import build_qwen_tokenizer  # noqa: E402
from qcls.scoring.strategies import get_strategy  # noqa: E402
from qcls.scoring.tokenization import encode_prompt, encode_query  # noqa: E402
from qcls.scoring.trie import LabelTrie  # noqa: E402

BUCKETS = [4, 8, 12, 16, 24, 32, 48, 64]  # conf/engine/fast.yaml
TOL = 4e-3  # fp16 outputs of O(1): a wrong or missing key shows up as O(0.1)


@dataclasses.dataclass(frozen=True)
class Heads:
    heads: int
    kv: int
    dim: int
    layers: int
    device: str = "cuda"


QWEN3 = Heads(32, 8, 128, 36)


@dataclasses.dataclass
class Case:
    name: str
    b: int
    packer: Packer
    d: dict
    n: int
    tokens: int  # the bucket's query tokens
    pool_len: int
    key_len: int
    floor_bytes: int
    flops: int
    used: int  # tokens that are not padding
    batch: list = dataclasses.field(default_factory=list)  # the queries' ids

    def descriptors(self, tile: int) -> dict:
        """The batch's descriptors with attention tiles of `tile` tokens (a plan's Tuning.row_tile), on the device
        of the case's own (`d`, packed in the default tiles)."""
        if tile == self.packer.tiles[0]:
            return self.d
        buf = torch.zeros(self.packer.buffer_len(self.b, self.n), dtype=torch.long)
        self.packer.pack(self.batch, self.n, buf, tile)
        return unpack(buf.to(self.d["ids"].device), self.n, self.packer.n_reads(self.b), len(self.packer.prompts))


def layouts(tok, prompts: list[dict]) -> list[PromptLayout]:
    out = []
    for spec in (PromptSpec.model_validate(p) for p in prompts):
        pt = encode_prompt(tok, spec)
        trie = LabelTrie.build(pt.label_ids, pt.end_id)
        plan = get_strategy("trie").plan(trie)
        out.append(PromptLayout(pt, trie, plan, trie.row_nodes(plan.read_nodes)))
    return out


def make_case(tok, name: str, prompts: list[dict], b: int, hs: Heads) -> Case:
    lays = layouts(tok, prompts)
    pool = plan_prefixes([p.tokens.prefix_ids for p in lays], 16)
    pool_len = pool.n_slots + (-pool.n_slots) % 8
    packer = Packer(lays, pool, pool_len)
    batch = [encode_query(tok, q, 64) for q in (QUERIES * b)[:b]]
    total = sum(map(len, batch))
    tokens = next(x for x in token_buckets(BUCKETS, b) if x >= total)  # the engine's bucket
    n = packer.n_tokens(b, tokens)
    buf = torch.zeros(packer.buffer_len(b, n), dtype=torch.long)
    packer.pack(batch, n, buf)
    d = unpack(buf.to(hs.device), n, packer.n_reads(b), len(lays))
    flops = attention_flops([total + b * p.const_len for p in lays], packer.prefix_len.tolist()[:-1], hs.layers,
                            hs.heads, hs.dim)
    return Case(name, b, packer, d, n, tokens, pool_len, pool_len + n + (-(pool_len + n)) % 16,
                kv_read_bytes(pool, hs.layers, hs.kv, hs.dim), flops, int((d["prompt"] < len(lays)).sum()), batch)


def timed_ms(fn, device: str) -> float:
    if device == "cuda":
        return C.graph_ms(fn)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


class Timer:
    """Attention of one case over every layer, each layer with its own random K/V. `fused`: the kernels take
    a random QKV GEMM output and rotate it themselves (engine.fuse_qkv_attention, Gemma3-style norms)."""

    def __init__(self, case: Case, hs: Heads, windows: list[int], fused: bool = False):
        g = torch.Generator(device=hs.device).manual_seed(0)
        dtype = torch.float16 if hs.device == "cuda" else torch.float32
        self.case, self.hs, self.windows, self.dtype = case, hs, windows, dtype
        self.q = torch.randn(case.n, hs.heads, hs.dim, device=hs.device, dtype=dtype, generator=g)
        shape = (hs.layers, hs.kv, case.key_len, hs.dim)
        self.k = torch.randn(shape, device=hs.device, dtype=dtype, generator=g)
        self.v = torch.randn(shape, device=hs.device, dtype=dtype, generator=g)
        self.raw = None
        if fused:
            qkv = torch.randn(case.n, hs.heads + 2 * hs.kv, hs.dim, device=hs.device, dtype=dtype, generator=g)
            ang = torch.rand(case.n, hs.dim, device=hs.device, generator=g) * 6.28
            w = lambda: 0.1 * torch.randn(hs.dim, device=hs.device, dtype=dtype, generator=g)  # noqa: E731
            self.raw = A.RawQKV(qkv[:, :hs.heads], qkv[:, hs.heads:hs.heads + hs.kv], qkv[:, hs.heads + hs.kv:],
                                ang.cos().to(dtype), ang.sin().to(dtype), w(), w(), 1e-6, True)
        vis, pos = case.packer.visible.to(hs.device), case.packer.slot_pos.to(hs.device)
        self.dense = A.DenseAttention(lambda w: build_mask(case.d, vis, case.key_len, w, pos), case.key_len)
        self.ref = {w: self.dense(self.q, self.k[0], self.v[0], window=w).clone() for w in set(windows)}

    def tree(self, tuning: Tuning) -> tuple[float, float]:
        """(ms for all layers, max |Δ| against dense SDPA on layer 0 under each window used; fused: against the
        unfused kernels over q/k/v rotated by qkv_kernels.rope_torch)."""
        c, u = self.case, self.case.used
        plan = plan_tree(c.packer, c.b, c.tokens, self.hs.heads // self.hs.kv, tuning, self.hs.kv).to(self.hs.device)
        attn = A.TreeAttention(c.descriptors(plan.tuning.row_tile), plan, c.pool_len, self.hs.heads, self.hs.dim,
                               self.dtype)
        if self.raw is not None:  # the unfused kernels over q and this forward's K/V rotated by rope_torch
            r, err = self.raw, 0.0
            q = rope_torch(r.q, r.cos, r.sin, r.q_norm, r.eps, r.offset)
            k, v = self.k[0].clone(), self.v[0].clone()
            k[:, c.pool_len:c.pool_len + c.n] = rope_torch(r.k, r.cos, r.sin, r.k_norm, r.eps, r.offset).transpose(0, 1)
            v[:, c.pool_len:c.pool_len + c.n] = r.v.transpose(0, 1)
            for w in set(self.windows):
                got = attn(self.q, self.k[0], self.v[0], window=w, raw=r)[:u].float()
                err = max(err, (got - attn(q, k, v, window=w)[:u].float()).abs().max().item())
        else:
            err = max((attn(self.q, self.k[0], self.v[0], window=w)[:u].float() - r[:u].float()).abs().max().item()
                      for w, r in self.ref.items())
        return self.forward_ms(attn, self.raw), err

    def forward_ms(self, attn, raw, hot: bool = False) -> float:
        """ms of `attn` over every layer, each on its own K/V (hot: every layer on layer 0's, which stay in the L2)."""
        return timed_ms(lambda: [attn(self.q, self.k[0 if hot else i], self.v[0 if hot else i], window=w, raw=raw)
                                 for i, w in enumerate(self.windows)], self.hs.device)

    def sdpa(self) -> float:
        return timed_ms(lambda: [self.dense(self.q, self.k[i], self.v[i], window=w) for i, w in enumerate(self.windows)],
                        self.hs.device)


def run(timers: dict, tuning: Tuning, keys) -> dict:
    out = {}
    for key in keys:
        try:
            ms, err = timers[key].tree(tuning)
        except Exception as e:  # noqa: BLE001 — a shape the GPU cannot compile is a result, not the end
            print(f"  {key} {_short(tuning)}: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
            ms, err = float("inf"), float("nan")
        if not err <= TOL:
            print(f"  {key} {_short(tuning)}: max |Δ| {err} against dense SDPA: rejected", flush=True)
            ms = float("inf")
        out[key] = (ms, err)
    return out


def gemma_rows(tok, sets: dict, device: str, layers_scale: float, names, batches) -> list[tuple]:
    """d=256 (Gemma3 270M: 4 query / 1 KV head, 18 layers; 4B: 8 / 4, 34 layers), window 512 on 5 of 6 layers."""
    rows = []
    for label, heads, kv, layers in [("gemma3-270m", 4, 1, 18), ("gemma3-4b", 8, 4, 34)]:
        hs = Heads(heads, kv, 256, max(1, int(layers * layers_scale)), device)
        windows = [0 if (i + 1) % 6 == 0 else 512 for i in range(hs.layers)]
        shipped = tuning_for(256, heads // kv, torch.device(device))
        for name in names:
            for b in batches:
                tm = Timer(make_case(tok, name, sets[name], b, hs), hs, windows)
                variants = {"shipped": shipped, "prefix walked inline": shipped.with_(inline_reads=1 << 30),
                            "bq=8 row_bt=8": shipped.with_(bq=8, row_bt=8),
                            "bn=16 row_bn=16": shipped.with_(bn=16, row_bn=16)}
                for what, t in variants.items():
                    ms, err = run({0: tm}, t, [0])[0]
                    rows.append((label, name, b, what, ms, err, tm.sdpa() if t is shipped else None))
                del tm
                C.free()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--budget-s", type=float, default=240, help="stop trying kernel candidates after this long")
    ap.add_argument("--out-tuning", default=None, help="write the chosen tuning here (JSON, for bench/prefix.py)")
    ap.add_argument("--no-gemma", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="CPU: Triton interpreter, 4/2 heads of 16, one layer")
    ap.add_argument("--variants", action="store_true",
                    help="only the row kernel's shapes (ROW_VARIANTS) on ecommerce8, batch 1-4, ms per forward")
    ap.add_argument("--ablate", action="store_true",
                    help="where the row kernel's time goes on ecommerce8 at batch 1 and 4 (parts of the work taken away)")
    ap.add_argument("--tile-layouts", action="store_true",
                    help="Gemma3-4B's row kernel over tiles of several rows of one prompt, emulated (ecommerce8, batch 1-4)")
    args = ap.parse_args()
    if args.ablate or args.variants or args.tile_layouts:  # the row kernel alone on ecommerce8 (attention_variants.py)
        from bench import attention_variants as V  # (it imports this module's timers)
        flag, title, config, rows = (
            ("--ablate", "where the row kernel's time goes", "shipped tuning, q/k/v fused; parts of the work taken away "
             "through the tables (outputs then wrong, only timed); K/V hot: every layer on layer 0's K/V",
             V.ablation_rows) if args.ablate else
            ("--tile-layouts", "the row kernel's programs cut other ways", "Gemma3-4B heads (34 layers, window 1024 on "
             "5 of 6), q/k/v fused; tile tables emulating the layouts (outputs then wrong, only timed)",
             V.tile_layout_rows) if args.tile_layouts else
            ("--variants", "the row kernel's shapes", "Qwen3-4B heads (36 layers), Gemma3-4B heads (34 layers, window "
             "1024 on 5 of 6), q/k/v fused as they ship", V.variant_rows))
        text = C.header(f"attention: {title} on ecommerce8 (ms per forward's attention)",
                        f"bench/attention.py {flag}{' --smoke' if args.smoke else ''}; {config}")
        text += rows(build_qwen_tokenizer(), "cpu" if args.smoke else "cuda", args.smoke)
        print(text) if args.smoke else C.append(text)
        return
    hs = Heads(4, 2, 16, 1, "cpu") if args.smoke else QWEN3
    tok = build_qwen_tokenizer()
    base = [p.model_dump() for p in compose(["prompts=ecommerce8"]).prompts]
    sets = {**prompt_sets(tok, base), "ecommerce8": base,
            "ecommerce8_fewshot": [p.model_dump() for p in compose(["prompts=ecommerce8_fewshot"]).prompts]}
    bw = C.copy_bandwidth_gbs() * 1e9 if hs.device == "cuda" else 1e10
    names, batches = (list(sets), (1, 4)) if not args.smoke else ([BASE, "prefix 256", "shared 1k + 64", "ecommerce8"], (1,))
    cases = {(name, b): make_case(tok, name, sets[name], b, hs) for name in names for b in batches}
    timers = {k: Timer(c, hs, [0] * hs.layers) for k, c in cases.items()}
    shipped, notes = tuning_for(hs.dim, hs.heads // hs.kv, torch.device(hs.device)), []

    def log(stage, scores, chosen):
        notes.append(f"{stage}: chosen {_short(chosen) or 'defaults'}")
        print(notes[-1] + "".join(f"\n    {k}: {v}" for k, v in scores.items()), flush=True)

    tuning = sweep(timers, cases, bw, args.budget_s, shipped, run, log) if args.sweep else shipped
    final = run(timers, tuning, list(timers))
    rows = []
    for k, c in cases.items():
        floor, added = c.floor_bytes / bw * 1e3, final[k][0] - final[(BASE, k[1])][0]
        rows.append(dict(case=k[0], b=k[1], tokens=c.n, prefix_keys=int(c.packer.prefix_len.max()), kv_gb=c.floor_bytes / 1e9,
                         floor_ms=floor, tree_ms=final[k][0], added_ms=added, ratio=added / floor, err=final[k][1],
                         tflops=c.flops / final[k][0] / 1e9, sdpa_ms=timers[k].sdpa()))
    del timers
    C.free()
    gemma = [] if args.no_gemma else gemma_rows(tok, sets, hs.device, 1 / 34 if args.smoke else 1.0,
                                                 ["shared 1k + 64"] if args.smoke else ["prefix 1k", "shared 1k + 64"],
                                                 batches)
    report(rows, gemma, tuning, notes, bw, hs, args)


def report(rows, gemma, tuning, notes, bw, hs, args) -> None:
    text = C.header("attention: tree kernels per prefix length vs the prefix-KV read floor",
                    f"bench/attention.py{' --sweep' if args.sweep else ''}{' --smoke' if args.smoke else ''}; {hs.layers} "
                    f"layers (own K/V each) in one CUDA graph; H={hs.heads}, KV={hs.kv}, d={hs.dim}; copy bandwidth "
                    f"{bw / 1e9:.0f} GB/s; {tuning}")
    text += ("| case | batch | tokens | longest prefix | prefix K/V GB | floor ms | tree ms | added over prefix 64 | "
             "added / floor | TFLOP/s (prefix part) | dense SDPA ms | max abs Δ |\n" + "|---" * 12 + "|\n")
    text += "".join(f"| {r['case']} | {r['b']} | {r['tokens']} | {r['prefix_keys']} | {r['kv_gb']:.3f} | {r['floor_ms']:.3f} | "
                    f"{r['tree_ms']:.3f} | {r['added_ms']:.3f} | {r['ratio']:.2f} | {r['tflops']:.0f} | "
                    f"{r['sdpa_ms']:.3f} | {r['err']:.4f} |\n"
                    for r in rows)
    text += "".join(f"\n- sweep {n}" for n in notes) + ("\n" if notes else "")
    if gemma:
        text += ("\nGemma3 head shapes (d=256), window 512 on 5 of every 6 layers, checked against dense SDPA with the "
                 "same windows:\n\n| model | case | batch | tuning | tree ms | max abs Δ | dense SDPA ms |\n"
                 "|---|---|---|---|---|---|---|\n")
        text += "".join(f"| {m} | {c} | {b} | {t} | {ms:.3f} | {e:.4f} | {'' if s is None else f'{s:.3f}'} |\n"
                        for m, c, b, t, ms, e, s in gemma)
    if args.smoke:
        print(text)
    else:
        C.append(text + "\n")
    if args.out_tuning:
        with open(args.out_tuning, "w") as f:
            json.dump({str(hs.dim): dataclasses.asdict(tuning)}, f)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "attention.json"), "w") as f:
            json.dump({"tuning": dataclasses.asdict(tuning), "rows": rows, "gemma": gemma, "notes": notes}, f,
                      indent=1, default=str)
    bad = [r for r in rows if not r["err"] <= TOL] + [g for g in gemma if not g[5] <= TOL]
    print(f"best tuning for d={hs.dim}: {tuning!r}" + (f"\nFAILED correctness: {bad}" if bad else ""), flush=True)
    if bad:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
