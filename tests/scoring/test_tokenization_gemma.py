"""Canonical tokenization under the real Gemma3 tokenizer (SentencePiece-style: '▁' marks a space), from the
gemma3_demo package: label prefixes, multi-token labels, first-token collisions and end tokens behave as
under Qwen's byte-level BPE."""
from __future__ import annotations

import pytest

from qcls.config import PromptSpec
from qcls.scoring.tokenization import check_first_tokens, encode_prompt
from qcls.scoring.trie import LabelTrie

ZH_CATEGORY = ["连衣裙", "牛仔裤", "衬衫", "风衣", "半身裙", "T恤", "卫衣", "针织衫", "其他", "无"]
ZH_AUDIENCE = ["男童", "女童", "男士", "女士", "孕妇", "无"]
EN = {"category": ["dress", "jeans", "shirt", "trench", "skirt", "tee", "hoodie", "knit", "other", "none"],
      "audience": ["boy", "girl", "man", "woman", "pregnant", "none"]}
SPACE = 236743  # '▁' alone: the first token of ' 连衣裙', ' 衬衫', ' 卫衣', ' 针织衫', ' 孕妇'


def plain(name: str, labels: list[str], **kw) -> PromptSpec:
    return PromptSpec(name=name, template="<bos>Task.\n\nQuery: {query}\nLabel:", labels=labels, **kw)


def test_segments_are_encoded_separately_with_written_special_tokens(gemma_tokenizer):
    tok = gemma_tokenizer
    pt = encode_prompt(tok, plain("cat", ["dress", "none"]))
    assert pt.prefix_ids[0] == tok.bos_token_id == 2  # written in the template, never added
    assert tok.decode(list(pt.prefix_ids)) == "<bos>Task.\n\nQuery: " and tok.decode(list(pt.suffix_ids)) == "\nLabel:"
    assert pt.label_ids == ((tok.convert_tokens_to_ids("▁dress"),), (tok.convert_tokens_to_ids("▁none"),))
    assert pt.end_id == tok.eos_token_id == 1
    turn = encode_prompt(tok, PromptSpec(name="chat", template="<start_of_turn>user\n{query}<end_of_turn>\n",
                                         labels=["a", "b"]))
    assert turn.prefix_ids[0] == 105 and turn.suffix_ids[0] == 106  # Gemma's chat markup is special tokens


def test_label_prefix_is_the_sentencepiece_space(gemma_tokenizer):
    tok = gemma_tokenizer
    spaced = encode_prompt(tok, plain("a", ["男士", "dress"]))
    bare = encode_prompt(tok, plain("b", ["男士", "dress"], label_prefix=""))
    assert tok.convert_ids_to_tokens(list(spaced.label_ids[0])) == ["▁男", "士"]
    assert tok.convert_ids_to_tokens(list(bare.label_ids[0])) == ["男", "士"]
    assert tok.convert_ids_to_tokens(list(spaced.label_ids[1])) == ["▁dress"]


def test_english_mission_labels_are_single_tokens(gemma_tokenizer):
    for name, labels in EN.items():
        pt = encode_prompt(gemma_tokenizer, plain(name, labels))
        check_first_tokens(gemma_tokenizer, pt)
        assert all(len(ids) == 1 for ids in pt.label_ids), name


@pytest.mark.parametrize("labels,shared,token", [(ZH_AUDIENCE, {"男童", "男士"}, "▁男"),
                                                 (ZH_AUDIENCE, {"女童", "女士"}, "▁女"),
                                                 (ZH_CATEGORY, {"连衣裙", "衬衫", "卫衣", "针织衫"}, "▁")])
def test_chinese_labels_collide_on_first_tokens(gemma_tokenizer, labels, shared, token):
    tok = gemma_tokenizer
    pt = encode_prompt(tok, plain("zh", labels))
    first = {lab: ids[0] for lab, ids in zip(pt.labels, pt.label_ids)}
    tid = tok.convert_tokens_to_ids(token)
    assert {lab for lab, t in first.items() if t == tid} == shared
    with pytest.raises(ValueError) as e:
        check_first_tokens(tok, pt)
    msg = str(e.value)
    assert all(f"'{lab}'" in msg for lab in shared) and str(tid) in msg and "scoring=trie" in msg


def test_chinese_tries_branch_where_labels_diverge(gemma_tokenizer):
    """The audience trie branches four ways at the root ('▁男', '▁女', '▁' of 孕妇, '▁无') and two ways at
    '▁男' and '▁女': trie scoring reads the root and those two nodes, whatever the labels' lengths."""
    pt = encode_prompt(gemma_tokenizer, plain("zh", ZH_AUDIENCE))
    trie = LabelTrie.build(pt.label_ids, pt.end_id)
    assert not trie.needs_end()
    ids = dict(zip(pt.labels, pt.label_ids))
    assert ids["无"] == (gemma_tokenizer.convert_tokens_to_ids("▁无"),) and ids["孕妇"][0] == SPACE
    branching = [i for i in range(len(trie.nodes)) if trie.is_branching(i)]


def test_a_label_that_is_a_token_prefix_of_another_ends_with_the_end_token(gemma_tokenizer):
    """' knit' is one token and ' knitwear' is ' knit' + 'wear': knit needs the end child (eos by default,
    or label_end, e.g. the newline that follows a label in a few-shot prompt)."""
    tok = gemma_tokenizer
    pt = encode_prompt(tok, plain("p", ["knit", "knitwear", "none"]))
    assert pt.label_ids[1][:1] == pt.label_ids[0]
    assert LabelTrie.build(pt.label_ids, pt.end_id).needs_end() and pt.end_id == 1
    nl = encode_prompt(tok, plain("p", ["knit", "knitwear", "none"], label_end="\n"))
    assert nl.end_id == tok.convert_tokens_to_ids("\n") == 107


def test_shipped_gemma_prompts_encode_labels_as_in_their_examples(gemma_tokenizer):
    """In the shipped base-model prompts a label after 'Field:' tokenizes the same inside an example line as
    on its own after the suffix, so the examples teach exactly the tokens that are scored."""
    from qcls.config.compose import compose
    tok = gemma_tokenizer
    for spec in compose(["prompts=gemma3_ecommerce8_fewshot"]).prompts:
        pt = encode_prompt(tok, spec)
        field = spec.suffix.split("\n")[-1]
        for lab, ids in zip(spec.labels, pt.label_ids):
            joint = tok.encode(f"{field}{spec.label_prefix}{lab}\n", add_special_tokens=False)
            assert joint == tok.encode(field, add_special_tokens=False) + list(ids) + [107], (spec.name, lab)
