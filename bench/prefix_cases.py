"""Prompt sets of the prefix-length benchmark (bench/prefix.py).

The 8 `ecommerce8` prompts with every prefix (the template before `{query}`) exactly n tokens under the real
Qwen tokenizer, or with a 1,024-token system block all 8 share followed by 64 tokens of their own. Filler is
random catalogue words: the kernels' cost does not depend on what the keys say.
"""
from __future__ import annotations

import random

SYSTEM, END = "<|im_start|>system\n", "<|im_end|>"
WORDS = ("dress jeans shirt trench skirt tee hoodie knit coat jacket blouse cardigan sweater vest shorts denim "
         "linen cotton wool silk leather suede velvet satin floral striped plaid slim loose cropped midi maxi "
         "mini petite plus tall maternity boys girls men women kids summer winter spring autumn black white "
         "red blue green pink grey navy beige olive cheap premium discount sale outlet vintage street sport "
         "formal casual office party beach travel wedding school season collar sleeve hem pocket zipper button "
         "waist size fit fabric stretch breathable warm light heavy soft classic modern trendy basic").split()
CASES = {"prefix 64": (64, 0), "prefix 256": (256, 0), "prefix 1k": (1024, 0), "prefix 2k": (2048, 0),
         "shared 1k + 64": (64, 1024)}  # name: (own prefix tokens, shared system-block tokens before them)
BASE = "prefix 64"  # what the others are timed against


def _count(tok, text: str) -> int:
    return len(tok.encode(text, add_special_tokens=False))


def _fill(tok, rng: random.Random, head: str, tail: str, n: int) -> str:
    """Words between head and tail so that head + words + tail is n tokens (ends with one-token ' x's)."""
    words: list[str] = []
    while (short := n - _count(tok, head + "".join(words) + tail)) > 24:
        words += [" " + rng.choice(WORDS) for _ in range(max(8, short // 2))]
    while words and _count(tok, head + "".join(words) + tail) > n - 4:
        words.pop()
    while _count(tok, head + "".join(words) + tail) < n:
        words.append(" x")
    got = _count(tok, head + "".join(words) + tail)
    if got != n:
        raise ValueError(f"filler gives {got} tokens, wanted {n}")
    return "".join(words)


def lengthened(tok, prompts: list[dict], own: int, shared: int = 0, seed: int = 0) -> list[dict]:
    """`prompts` (dicts whose template starts with a system turn) with prefixes of shared + own tokens: a
    common block of `shared` tokens (system markup included), then the prompt's own instructions, filler
    up to `own` tokens, and the rest of its prefix (distinct per prompt from their first words on)."""
    common = _fill(tok, random.Random(seed), SYSTEM, ".\n", shared) + ".\n" if shared else ""
    out = []
    for i, p in enumerate(prompts):
        pre, post = p["template"].split("{query}")
        if not pre.startswith(SYSTEM) or END not in pre:
            raise ValueError(f"prompt {p['name']}: the template does not start with a system turn")
        instructions, rest = pre[len(SYSTEM):].split(END, 1)
        head, tail = SYSTEM + common + instructions, END + rest
        if _count(tok, head + tail) > shared + own:
            raise ValueError(f"prompt {p['name']}: its own text is longer than {own} tokens")
        filler = _fill(tok, random.Random(f"{seed}-{i}-{own}-{shared}"), head, tail, shared + own)
        out.append({**p, "template": head + filler + tail + "{query}" + post})
    return out


def prompt_sets(tok, base: list[dict], longest: int | None = None) -> dict[str, list[dict]]:
    """The cases of CASES (those of at most `longest` prefix tokens, the base case always) built from the `base`
    prompts (ecommerce8)."""
    return {name: lengthened(tok, base, own, shared) for name, (own, shared) in CASES.items()
            if longest is None or name == BASE or own + shared <= longest}


def kv_read_bytes(pool, layers: int, kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> int:
    """Bytes of prefix K and V one forward must read: every pool slot once (a shared block counts once)."""
    return pool.n_slots * layers * 2 * kv_heads * head_dim * dtype_bytes


def attention_flops(prompt_tokens: list[int], prefix_lens: list[int], layers: int, heads: int, head_dim: int) -> int:
    """FLOPs of the prefix part of attention: every query token × query head × visible prefix key, one dot
    for the score and one for the output (2 · 2 · head_dim)."""
    return sum(t * n for t, n in zip(prompt_tokens, prefix_lens)) * layers * heads * 4 * head_dim
