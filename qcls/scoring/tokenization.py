"""Canonical tokenization (docs/design.md §1): prefix, query, suffix and label_prefix+label are each encoded on
their own, with no special tokens added, and concatenated. Reference and engine both use these ids."""
from __future__ import annotations

import threading
from dataclasses import dataclass

from qcls.config import PromptSpec
from qcls.errors import LabelSetError


class QueryError(ValueError):
    """A query that cannot be classified; reported for that query alone."""


@dataclass(frozen=True)
class PromptTokens:
    name: str
    labels: tuple[str, ...]
    prefix_ids: tuple[int, ...]
    suffix_ids: tuple[int, ...]
    label_ids: tuple[tuple[int, ...], ...]
    end_id: int | None  # token that ends a label which is a token-prefix of another


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False)) if text else []


def token_text(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id])


def _end_id(tokenizer, spec: PromptSpec) -> int | None:
    if spec.label_end is None:
        return tokenizer.eos_token_id
    ids = encode(tokenizer, spec.label_end)
    if len(ids) != 1:
        raise LabelSetError(f"prompt '{spec.name}': label_end {spec.label_end!r} must be one token, "
                         f"it encodes to {ids}")
    return ids[0]


def encode_prompt(tokenizer, spec: PromptSpec) -> PromptTokens:
    """Encode one prompt; refuse label sets whose token sequences cannot be told apart."""
    label_ids = tuple(tuple(encode(tokenizer, spec.label_prefix + lab)) for lab in spec.labels)
    seen: dict[tuple[int, ...], str] = {}
    for lab, ids in zip(spec.labels, label_ids):
        if not ids:
            raise LabelSetError(f"prompt '{spec.name}': label {lab!r} encodes to no tokens")
        if ids in seen:
            raise LabelSetError(f"prompt '{spec.name}': labels {seen[ids]!r} and {lab!r} encode to the same "
                             f"tokens {list(ids)}; they cannot be told apart")
        seen[ids] = lab
    pt = PromptTokens(spec.name, tuple(spec.labels), tuple(encode(tokenizer, spec.prefix)),
                      tuple(encode(tokenizer, spec.suffix)), label_ids, _end_id(tokenizer, spec))
    if not pt.suffix_ids and not pt.prefix_ids:
        raise LabelSetError(f"prompt '{spec.name}': the template has no text around {{query}}")
    return pt


def check_first_tokens(tokenizer, pt: PromptTokens) -> None:
    """first_token scoring reads one logit per label: labels sharing a first token are indistinguishable."""
    by_first: dict[int, list[str]] = {}
    for lab, ids in zip(pt.labels, pt.label_ids):
        by_first.setdefault(ids[0], []).append(lab)
    clashes = [(t, labs) for t, labs in by_first.items() if len(labs) > 1]
    if clashes:
        desc = "; ".join(f"{labs} share first token {t} ({token_text(tokenizer, t)!r})" for t, labs in clashes)
        raise LabelSetError(f"prompt '{pt.name}': first-token scoring (scoring=first_token or "
                         f"force_single_token_labels=true) cannot tell these labels apart: {desc}. "
                         "Use scoring=trie, or change the labels or label_prefix")


def encode_query(tokenizer, query: str, max_tokens: int, encode_fn=None) -> list[int]:
    """Query ids, or a QueryError naming the limit. Nothing is ever truncated. `encode_fn` (text → ids), when
    given, replaces `encode` (QueryEncoder's fast path)."""
    if not isinstance(query, str) or not query.strip():
        raise QueryError("empty query: give at least one non-whitespace character")
    ids = encode(tokenizer, query) if encode_fn is None else encode_fn(query)
    if len(ids) > max_tokens:
        raise QueryError(f"query is {len(ids)} tokens, over max_query_tokens={max_tokens}; shorten it "
                         "or raise max_query_tokens (and engine.query_buckets) in the config")
    return ids


# Strings the fast path must encode exactly as the tokenizer does before it is trusted: scripts, digits, the
# whitespace and special-token text that pre-tokenizers and added-token matching treat specially.
PROBES = ("women's summer floral midi dress", "  Boys  hoodie\tsize 140 ", "夏季女士碎花连衣裙", "café Ünïcode ß",
          "<|im_end|> <|endoftext|><s></s>[CLS]", "1234567 x\n\ny", "emoji 👗👖", "a")


class QueryEncoder:
    """encode_query for the request path: the tokenizers library's own encoder where the tokenizer is a fast
    (tokenizers-backed) one, without transformers' per-call wrapper (which costs ~3× the encode itself on an H100
    host), and a bounded cache of recent queries (tokenization is a pure function of the text). The fast path is
    used only if it gives the same ids as `tokenizer.encode` on PROBES and the warm-up query; otherwise every
    call goes through `tokenizer.encode` (`fast` says which)."""

    def __init__(self, tokenizer, max_tokens: int, cache_size: int = 4096, check: tuple[str, ...] = ()):
        self.tokenizer, self.max_tokens, self.cache_size = tokenizer, max_tokens, cache_size
        self.cache: dict[str, tuple[int, ...]] = {}
        self._lock = threading.Lock()
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self.fast = backend is not None and hasattr(backend, "encode")
        if self.fast:
            fn = self._backend_fn(tokenizer, backend)
            self.fast = all(fn(t) == encode(tokenizer, t) for t in PROBES + tuple(check))
            self._encode = fn if self.fast else None
        else:
            self._encode = None

    @staticmethod
    def _backend_fn(tokenizer, backend):
        enc = backend.encode

        def fn(text: str) -> list[int]:
            # transformers sets the backend's truncation/padding per call and resets them on the next plain
            # call; if another caller left them set, its own call gives the untruncated ids (and resets them)
            if getattr(backend, "truncation", None) is not None or getattr(backend, "padding", None) is not None:
                return encode(tokenizer, text)
            return enc(text, add_special_tokens=False).ids
        return fn

    def __call__(self, query: str) -> list[int]:
        hit = self.cache.get(query) if isinstance(query, str) else None
        if hit is not None:
            return list(hit)
        ids = encode_query(self.tokenizer, query, self.max_tokens, self._encode)
        with self._lock:  # a server's event loop (refusal check) and its launch thread both encode
            if len(self.cache) >= self.cache_size:
                self.cache.pop(next(iter(self.cache)))  # oldest first (dicts keep insertion order)
            self.cache[query] = tuple(ids)
        return ids


def tokenized(encoder: QueryEncoder, query: object) -> tuple[list[int] | None, str | None]:
    """(its ids, None), or (None, why `query` cannot be classified): the one rule, for every caller (a refused query
    gets an error result and the others proceed; a server refuses it before it takes a batch slot)."""
    if not isinstance(query, str):
        return None, f"a query must be a string, got {type(query).__name__}"
    try:
        return encoder(query), None
    except QueryError as e:
        return None, str(e)
    except Exception as e:  # e.g. a lone surrogate the tokenizer cannot take
        return None, f"query cannot be tokenized ({type(e).__name__}: {e})"


def refusal(encoder: QueryEncoder, query: object) -> str | None:
    """Why `query` cannot be classified, or None (`tokenized`; the ids are cached for the batch's own tokenize)."""
    return tokenized(encoder, query)[1]
