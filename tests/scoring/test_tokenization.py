"""Canonical tokenization with the real Qwen tokenizer and the demo model's tokenizer."""
from __future__ import annotations

import pytest

from qcls.config import PromptSpec
from qcls.testing.qwen_tokenizer import build_qwen_tokenizer
from qcls.scoring.tokenization import QueryError, check_first_tokens, encode_prompt, encode_query
from tests.conftest import prompt

ZH_CATEGORY = ["连衣裙", "牛仔裤", "衬衫", "风衣", "半身裙", "T恤", "卫衣", "针织衫", "其他", "无"]


@pytest.fixture(scope="module")
def qwen():
    return build_qwen_tokenizer()


def test_segments_are_encoded_separately(qwen):
    spec = PromptSpec(**prompt("cat", ["dress", "none"]))
    pt = encode_prompt(qwen, spec)
    assert pt.prefix_ids[0] == 151644 and pt.suffix_ids[0] == 151645  # <|im_start|> … query … <|im_end|>
    assert qwen.decode(list(pt.prefix_ids)) == spec.prefix and qwen.decode(list(pt.suffix_ids)) == spec.suffix
    assert pt.label_ids == tuple(tuple(qwen.encode(f" {w}", add_special_tokens=False)) for w in ("dress", "none"))
    assert all(len(ids) == 1 for ids in pt.label_ids)
    assert pt.end_id == 151645  # <|im_end|>: the end-of-turn token ends a label by default


def test_chinese_labels_share_first_tokens(qwen):
    pt = encode_prompt(qwen, PromptSpec(**prompt("zh", ZH_CATEGORY)))
    ids = dict(zip(pt.labels, pt.label_ids))
    assert ids["风衣"][0] == ids["针织衫"][0] == 18137
    assert ids["半身裙"][0] == ids["卫衣"][0] == 66521
    with pytest.raises(ValueError) as e:
        check_first_tokens(qwen, pt)
    msg = str(e.value)
    assert "'风衣'" in msg and "'针织衫'" in msg and "18137" in msg and "scoring=trie" in msg


def test_english_mission_labels_pass_first_token_check(qwen):
    pt = encode_prompt(qwen, PromptSpec(**prompt("en", ["dress", "jeans", "tee", "hoodie", "none"])))
    check_first_tokens(qwen, pt)
    assert all(len(ids) == 1 for ids in pt.label_ids)


def test_labels_that_encode_identically_are_refused(qwen):
    spec = PromptSpec(**prompt("p", ["caf\u00e9", "cafe\u0301"]))  # distinct strings, NFC-equal for Qwen
    with pytest.raises(ValueError, match="cannot be told apart"):
        encode_prompt(qwen, spec)
    with pytest.raises(ValueError, match="must be one token"):
        encode_prompt(qwen, PromptSpec(**{**prompt("p", ["a", "b"]), "label_end": "two words"}))


def test_query_errors_name_the_limit(qwen):
    with pytest.raises(QueryError, match="empty query"):
        encode_query(qwen, "   \n\t", 8)
    with pytest.raises(QueryError, match="over max_query_tokens=4"):
        encode_query(qwen, "one two three four five six", 4)
    assert encode_query(qwen, "夏季女士碎花连衣裙", 64) == qwen.encode("夏季女士碎花连衣裙", add_special_tokens=False)
    assert len(encode_query(qwen, "👗\x07 dress", 64)) > 0  # emoji and control characters are just text


# ---- QueryEncoder: the request path's tokenizer call -------------------------------------------------------

def _qwen_tok():
    return build_qwen_tokenizer()


def test_query_encoder_fast_path_gives_the_tokenizers_ids():
    from qcls.scoring.tokenization import QueryEncoder, encode
    tok = _qwen_tok()
    enc = QueryEncoder(tok, 64)
    assert enc.fast
    for q in ["women's summer floral midi dress", "夏季女士碎花连衣裙", " trailing space ", "<|im_end|>x", "7 × 8"]:
        assert enc(q) == encode(tok, q)
        assert enc(q) == encode(tok, q)  # the cached answer too


def test_query_encoder_is_not_truncated_by_a_backend_left_truncating():
    from qcls.scoring.tokenization import QueryEncoder, encode
    tok = _qwen_tok()
    enc = QueryEncoder(tok, 64, cache_size=0)
    tok("a long text of several words to cut", truncation=True, max_length=2)  # leaves the backend truncating?
    tok.backend_tokenizer.enable_truncation(2)  # (set it for sure)
    q = "women's summer floral midi dress"
    assert enc._encode(q) == encode(tok, q) and len(enc._encode(q)) > 2


def test_query_encoder_keeps_the_limits_and_errors():
    from qcls.scoring.tokenization import QueryEncoder, QueryError
    enc = QueryEncoder(_qwen_tok(), 3, cache_size=2)
    with pytest.raises(QueryError, match="over max_query_tokens=3"):
        enc("one two three four five")
    with pytest.raises(QueryError, match="empty query"):
        enc("   ")
    for q in ("a", "b", "c"):
        enc(q)
    assert list(enc.cache) == ["b", "c"]  # bounded: the oldest went first
    ids = enc("b")
    first = list(ids)
    ids.append(0)  # a caller's list is its own: the cache keeps the ids
    assert enc("b") == first


def test_query_encoder_falls_back_when_the_backend_disagrees():
    from qcls.scoring.tokenization import QueryEncoder, encode

    class Backend:
        def encode(self, text, add_special_tokens=False):
            return type("E", (), {"ids": [1]})()

    class Tok:
        backend_tokenizer = Backend()

        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

    enc = QueryEncoder(Tok(), 64)
    assert not enc.fast and enc("ab") == encode(Tok(), "ab") == [97, 98]
