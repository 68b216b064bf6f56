"""bench/attention.py --variants: the row kernel's shapes next to the shipped ones (tree_plan.TUNING) on ecommerce8 at
batch 1-4, Qwen3-4B and Gemma3-4B heads with the q/k/v work fused as they ship, and the registers, spills and shared
memory each variant compiled to (read from Triton's cache; the key is warps, stages and register limit). And
--ablate: where the row kernel's time goes (ablation_rows); --tile-layouts: other ways to cut the rows into the row
kernel's programs (tile_layout_rows)."""
from __future__ import annotations

from dataclasses import replace

import torch

from bench import common as C
from bench.attention import Heads, Timer, make_case, run
from qcls.compose import compose
from qcls.engine import attention as A
from qcls.engine.tree_plan import head_split, plan_tree, tuning_for

def layer_windows(hs: Heads, gemma: bool) -> list[int]:
    """Sliding windows per layer: Gemma3's 1024 on 5 of 6 layers, or none."""
    return [0 if (i + 1) % 6 == 0 or not gemma else 1024 for i in range(hs.layers)]


EARLY = {"query loads before the row keys": dict(row_early_q=True),
         "prefix's first step loaded early": dict(row_early_kv=True),
         "values loaded with keys": dict(row_values_with_keys=True),
         "query loads and first step early": dict(row_early_q=True, row_early_kv=True),
         "all three": dict(row_early_q=True, row_early_kv=True, row_values_with_keys=True)}
ROW_VARIANTS = {  # --variants: the row kernel's shapes (tree_plan.Tuning fields) against the shipped ones
    128: {"values loaded with keys": dict(row_values_with_keys=True)},  # (the others: bench/RESULTS.md, ccf3e9e)
    16: {"32-token tiles": dict(row_tile=32, row_bt=32), **EARLY},  # (--smoke's tiny heads)
    # (the sixth session's shapes, 16-key steps and 32-token tiles among them: bench/RESULTS.md, 43b6a5a)
    256: {"64-key steps": dict(row_bn=64),
          "64-key steps, 16 warps": dict(row_bn=64, row_warps=16),
          "16 warps": dict(row_warps=16),
          "3 stages": dict(row_stages=3),
          "1 stage": dict(row_stages=1),
          "64-key steps, 1 stage": dict(row_bn=64, row_stages=1)},
}


def compiled_resources(fn) -> dict:
    """(num_warps, num_stages, maxnreg) → 'regs/spills/shared' of every compiled variant of a Triton kernel."""
    out = {}
    for cache in getattr(fn, "device_caches", {}).values():
        for kern in (cache[0].values() if isinstance(cache, tuple) else ()):
            try:
                kern._init_handles()
                o = kern.metadata
                out[(o.num_warps, o.num_stages, getattr(o, "maxnreg", None))] = \
                    f"{kern.n_regs} regs, {kern.n_spills} spills, {o.shared // 1024} KiB shared"
            except Exception as e:  # noqa: BLE001 — Triton internals differ between versions: report, go on
                out[str(type(kern))] = f"unread ({type(e).__name__})"
    return out


def variant_rows(tok, device: str, smoke: bool) -> str:
    """The row kernel's shapes on ecommerce8 at batch 1-4, Qwen3-4B and Gemma3-4B heads with the q/k/v work fused
    (as they ship), each variant against the shipped tuning."""
    base = [p.model_dump() for p in compose(["prompts=ecommerce8"]).prompts]
    heads = [("qwen3-4b, fused", Heads(32, 8, 128, 36, device), True), ("gemma3-4b, fused", Heads(8, 4, 256, 34, device), True)]
    if smoke:
        heads = [("tiny d16", Heads(4, 2, 16, 1, "cpu"), False), ("tiny d16, fused", Heads(4, 2, 16, 1, "cpu"), True)]
    text = "| heads | variant | batch 1 | batch 2 | batch 3 | batch 4 | max abs Δ |\n|---|---|---|---|---|---|---|\n"
    for label, hs, fused in heads:
        shipped = tuning_for(hs.dim, hs.heads // hs.kv, torch.device(device))
        variants = {"shipped": shipped, **{k: shipped.with_(**v) for k, v in ROW_VARIANTS.get(hs.dim, {}).items()}}
        windows = layer_windows(hs, hs.dim == 256)
        timers = {b: Timer(make_case(tok, "ecommerce8", base, b, hs), hs, windows, fused) for b in (1, 2, 3, 4)}
        for what, t in variants.items():
            res = run(timers, t, list(timers))
            text += (f"| {label} | {what} | " + " | ".join(f"{res[b][0]:.3f}" for b in res) +
                     f" | {max(r[1] for r in res.values()):.4f} |\n")
            print(text.splitlines()[-1], flush=True)
        text += f"\n{label} compiled row kernels: {compiled_resources(A.R.row_kernel)}\n\n"
        del timers
        C.free()
    return text


def ablation_rows(tok, device: str, smoke: bool) -> str:
    """Where the row kernel's time goes on ecommerce8 (shipped tuning, q/k/v fused), at batch 1 and 4: the same
    launches with parts of the work taken away through the tables (the outputs are then wrong, only timed): no
    prefix walk (every prompt's run count 0), no row keys (row lengths 0), empty tiles (token counts 0 too: the
    launch and the descriptor loads), and the unfused kernels (q/k/v from the buffers). And "K/V hot": every layer
    reads layer 0's K/V, which then stay in the L2 (outputs right), against each layer its own (as in the engine,
    where the GEMMs' weights stream through the L2 between layers): the most an L2-resident prefix cache could give."""
    base = [p.model_dump() for p in compose(["prompts=ecommerce8"]).prompts]
    heads = [("qwen3-4b", Heads(32, 8, 128, 36, device)), ("gemma3-4b", Heads(8, 4, 256, 34, device))]
    if smoke:
        heads = [("tiny d16", Heads(4, 2, 16, 1, "cpu"))]
    text = ("| heads | batch | as shipped | no prefix walk | no row keys | empty tiles | unfused | K/V hot |\n"
            "|---|---|---|---|---|---|---|---|\n")
    for label, hs in heads:
        t = tuning_for(hs.dim, hs.heads // hs.kv, torch.device(device))
        windows = layer_windows(hs, hs.dim == 256)
        for b in (1, 4):
            tm = Timer(make_case(tok, "ecommerce8", base, b, hs), hs, windows, True)
            c = tm.case
            plan = plan_tree(c.packer, c.b, c.tokens, hs.heads // hs.kv, t, hs.kv).to(hs.device)
            dd = c.descriptors(plan.tuning.row_tile)
            no_row = dd["tiles"].clone().view(-1, A.TILE_FIELDS)
            no_row[:, 3] = 0
            empty = no_row.clone()
            empty[:, 1] = 0

            def ms(d, p, raw, hot=False):
                return tm.forward_ms(A.TreeAttention(d, p, c.pool_len, hs.heads, hs.dim, tm.dtype), raw, hot)
            cols = [ms(dd, plan, tm.raw),
                    ms(dd, replace(plan, inline_runs=torch.zeros_like(plan.inline_runs)), tm.raw),
                    ms({**dd, "tiles": no_row.view(-1)}, plan, tm.raw), ms({**dd, "tiles": empty.view(-1)}, plan, tm.raw),
                    ms(dd, plan, None), ms(dd, plan, tm.raw, hot=True)]
            text += f"| {label} | {b} | " + " | ".join(f"{x:.3f}" for x in cols) + " |\n"
            print(text.splitlines()[-1], flush=True)
            del tm
            C.free()
    return text


def _rows(case) -> list[tuple[int, int, int]]:
    """(first token, tokens, prompt) of every row of the case's batch but the pads' (read from its 16-token tiles)."""
    tiles = case.descriptors(16)["tiles"].view(-1, A.TILE_FIELDS).cpu().tolist()
    return sorted({(r0, rlen, p) for _, cnt, r0, rlen, p in tiles if cnt > 0 and p < len(case.packer.prompts)})


def _stream_tiles(case, tile: int, rows_per_tile: int) -> list[list[int]]:
    """Tile-table entries (t0, count, r0, row keys, prompt) of programs shaped as in a layout whose tiles hold several
    rows of one prompt: rows_per_tile > 0, up to that many whole rows while they fit `tile` tokens; 0, each prompt's
    rows as one stream of tokens cut every `tile` tokens (a row then split across tiles), its row keys every key of
    the rows a tile touches. The rows of a prompt are not adjacent in the packed batch, so each entry reads a span of
    as many tokens from its first row on: the same query vectors, prefix walk and row-key steps as such a program."""
    by_prompt: dict[int, list[tuple[int, int]]] = {}
    for r0, rlen, p in _rows(case):
        by_prompt.setdefault(p, []).append((r0, rlen))
    out = []
    for p, rs in by_prompt.items():
        lens = [n for _, n in rs]
        spans = []  # (start, end, first key, end of keys) along the prompt's stream of tokens
        if rows_per_tile:
            i = 0
            while i < len(rs):
                j, tot = i, 0
                while j < len(rs) and j - i < rows_per_tile and tot + lens[j] <= tile:
                    tot, j = tot + lens[j], j + 1
                at = sum(lens[:i])
                if j == i:  # a row longer than the tile: tiles of its own
                    spans += [(at + s, at + min(s + tile, lens[i]), at, at + lens[i]) for s in range(0, lens[i], tile)]
                    j = i + 1
                else:
                    spans.append((at, at + tot, at, at + tot))
                i = j
        else:
            bounds = [sum(lens[:i]) for i in range(len(lens) + 1)]
            for s in range(0, bounds[-1], tile):
                e = min(s + tile, bounds[-1])
                spans.append((s, e, max(b for b in bounds if b <= s), min(b for b in bounds if b >= e)))
        for s, e, k0, k1 in spans:
            t0 = min(rs[0][0] + s, case.n - (e - s))
            out.append([t0, e - s, min(rs[0][0] + k0, case.n - (k1 - k0)), k1 - k0, p])
    return out


TILE_LAYOUTS = {  # --tile-layouts: (tile tokens, rows per tile (0: a stream of each prompt's rows), head split)
    "one row, 16-token tiles, head split 2": (16, 1, 2),
    "two rows of one prompt, 32-token tiles": (32, 2, 1),
    "two rows of one prompt, 32-token tiles, head split 2": (32, 2, 2),
    "four rows of one prompt, 64-token tiles, head split 2": (64, 4, 2),
    "each prompt's stream, 16-token tiles": (16, 0, 1),
    "each prompt's stream, 32-token tiles": (32, 0, 1),
    "each prompt's stream, 32-token tiles, head split 2": (32, 0, 2),
    "each prompt's stream, 64-token tiles, head split 2": (64, 0, 2),
}


def tile_layout_rows(tok, device: str, smoke: bool) -> str:
    """Gemma3-4B heads (q/k/v fused) on ecommerce8 at batch 1-4: the row kernel with the shipped tuning against the
    same kernel over tile tables laid out as TILE_LAYOUTS (_stream_tiles; outputs then wrong, only timed). A kernel
    that really read several rows per program would add index loads and a same-row mask to these times."""
    base = [p.model_dump() for p in compose(["prompts=ecommerce8"]).prompts]
    hs = Heads(4, 2, 16, 1, "cpu") if smoke else Heads(8, 4, 256, 34, device)
    g = hs.heads // hs.kv
    windows = layer_windows(hs, True)
    text = "| batch | layout | programs | ms |\n|---|---|---|---|\n"
    for b in ((1, 4) if smoke else (1, 2, 3, 4)):
        tm = Timer(make_case(tok, "ecommerce8", base, b, hs), hs, windows, True)
        c = tm.case
        plan = plan_tree(c.packer, b, c.tokens, g, tuning_for(hs.dim, g, torch.device(device)), hs.kv).to(hs.device)
        dd = c.descriptors(plan.tuning.row_tile)

        def ms(d, p):
            return tm.forward_ms(A.TreeAttention(d, p, c.pool_len, hs.heads, hs.dim, tm.dtype), tm.raw)
        busy = int((dd["tiles"].view(-1, A.TILE_FIELDS)[:, 1] > 0).sum())
        shipped = plan.tuning
        text += (f"| {b} | shipped ({shipped.row_tile}-token tiles, head split {head_split(shipped, g)}) | "
                 f"{busy * hs.kv * head_split(shipped, g)} | {ms(dd, plan):.3f} |\n")
        print(text.splitlines()[-1], flush=True)
        for what, (tile, per, split) in TILE_LAYOUTS.items():
            entries = _stream_tiles(c, tile, per)
            table = torch.zeros(max(len(entries), dd["tiles"].numel() // A.TILE_FIELDS), A.TILE_FIELDS,
                                dtype=dd["tiles"].dtype)
            table[:len(entries)] = torch.tensor(entries, dtype=table.dtype)
            t = shipped.with_(row_tile=tile, row_bt=tile, row_head_split=split, row_maxnreg=0, row_early_q=False,
                              row_early_kv=False, row_values_with_keys=False)
            got = ms({**dd, "tiles": table.view(-1).to(hs.device)}, replace(plan, tuning=t))
            text += f"| {b} | {what} | {len(entries) * hs.kv * head_split(t, g)} | {got:.3f} |\n"
            print(text.splitlines()[-1], flush=True)
        del tm
        C.free()
    return text
