"""The reference scorer on real weights (demo model) and a tiny random Qwen3."""
from __future__ import annotations

import math

import pytest
import torch

from qcls.backends.registry import get_backend
from qcls.config import PromptSpec
from qcls.scoring.reference import reference_scores
from qcls.scoring.tokenization import encode_prompt
from qcls.scoring.trie import LabelTrie
from tests.conftest import prompt, tiny_cfg


def _setup(cfg, spec_dict):
    loaded = get_backend("fp16").load(cfg)
    pt = encode_prompt(loaded.tokenizer, PromptSpec(**spec_dict))
    return loaded, pt, LabelTrie.build(pt.label_ids, pt.end_id)


@pytest.mark.slow
def test_demo_hoodie_exact_is_sum_of_its_two_token_logprobs(demo_cfg_overrides):
    from qcls.config.compose import compose
    cfg = compose(demo_cfg_overrides)
    spec = cfg.prompts[0].model_dump()
    loaded, pt, trie = _setup(cfg, spec)
    hoodie = pt.labels.index("hoodie")
    assert pt.label_ids[hoodie] == (25533, 519) and pt.label_ids[pt.labels.index("tee")] == (543, 85)
    q = loaded.tokenizer.encode("boys hoodie", add_special_tokens=False)
    base = list(pt.prefix_ids) + q + list(pt.suffix_ids)
    with torch.no_grad():  # one independent forward over the whole sequence
        logp = loaded.model(torch.tensor([base + [25533, 519]])).logits[0].float().log_softmax(-1)
    want = logp[len(base) - 1, 25533].item() + logp[len(base), 519].item()
    exact = reference_scores(loaded.model, pt, trie, q, "exact")
    assert exact[hoodie] == pytest.approx(want, abs=1e-5)
    mean = reference_scores(loaded.model, pt, trie, q, "mean_logprob")
    assert mean[hoodie] == pytest.approx(want / 2, abs=1e-5)


def test_trie_scores_form_a_distribution(tiny_dirs):
    spec = prompt("a", ["man", "manager", "woman", "boy", "boys", "none"])
    loaded, pt, trie = _setup(tiny_cfg(tiny_dirs["qwen3"], [spec]), spec)
    assert trie.needs_end()
    q = loaded.tokenizer.encode("red dress", add_special_tokens=False)
    s = reference_scores(loaded.model, pt, trie, q, "trie")
    assert sum(math.exp(v) for v in s) == pytest.approx(1.0, abs=1e-5)
    exact = reference_scores(loaded.model, pt, trie, q, "exact")
    assert sum(math.exp(v) for v in exact) < 1.0  # full-vocabulary probabilities of a few strings
    first = reference_scores(loaded.model, pt, trie, q, "first_token")
    assert first[0] == first[1]  # 'man' and 'manager' share their first token


def test_a_positions_logits_do_not_depend_on_how_many_positions_are_read(tiny_dirs):
    """The LM head runs on at least ROWS_KEPT positions: a GEMM of fewer rows takes another CPU kernel, and a
    position's logits would change in their last bits with the number of positions a label reads (the first-token
    score of two labels with one first token would then be two numbers). On the real Qwen vocabulary, where the LM
    head is a tiny model's largest GEMM."""
    from qcls.scoring.reference import label_logits
    loaded = get_backend("fp16").load(tiny_cfg(tiny_dirs["qwen3_qwentok"], [prompt("a", ["x", "y"])]))
    ids = loaded.tokenizer.encode("query: red summer dress\nlabel: dress", add_special_tokens=False)
    every = label_logits(loaded.model, ids)
    assert every.shape == (len(ids), loaded.model.config.vocab_size)
    for want in (1, 2, 3, 5):
        assert torch.equal(label_logits(loaded.model, ids, first=len(ids) - want), every[-want:]), want
