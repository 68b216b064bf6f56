"""The decoder's fused weights: one copy on the device however many engines are built on the weights."""
from __future__ import annotations

import pytest
import torch

from qcls.backends.registry import get_backend
from qcls.classifier import Classifier
from qcls.engine.decoder import Decoder, _side_by_side
from tests.conftest import prompt, tiny_cfg

PROMPTS = [prompt("colour", ["red", "green", "blue", "none"]), prompt("size", ["small", "large"])]
QUERIES = ["red knit dress", "large boys tee", "夏季女士碎花连衣裙"]


def fused_storages(dec: Decoder) -> set[int]:
    return {t[0].untyped_storage().data_ptr() for t in dec.qkv + dec.gate_up if t is not None}


def test_side_by_side_is_a_view_only_of_adjacent_parts():
    base = torch.arange(24.0).reshape(6, 4)
    whole = _side_by_side([base[:2], base[2:3], base[3:6]])
    assert whole is not None and whole.data_ptr() == base.data_ptr() and torch.equal(whole, base)
    assert _side_by_side([base[:2], base[3:6]]) is None  # a gap between them
    assert _side_by_side([base[2:4], base[:2]]) is None  # out of order
    assert _side_by_side([base[:2], base[2:4].clone()]) is None  # another storage
    assert _side_by_side([base[:, :2], base[:, 2:]]) is None  # not contiguous
    bias = torch.arange(6.0)
    assert torch.equal(_side_by_side([bias[:4], bias[4:]]), bias)


@pytest.mark.parametrize("family", ["qwen3", "gemma3", "qwen2"])
def test_a_second_decoder_shares_the_fused_weights(tiny_dirs, family):
    cfg = tiny_cfg(tiny_dirs[family], PROMPTS)
    model = get_backend("fp16").load(cfg).model
    layer = model.model.layers[0]
    first = Decoder(model, 64)
    assert first.qkv[0] is not None and first.gate_up[0] is not None
    # the modules read the fused tensor (the reference path still works on them)
    assert layer.self_attn.q_proj.weight.data_ptr() == first.qkv[0][0].data_ptr()
    storages = fused_storages(first)
    second = Decoder(model, 64)
    assert fused_storages(second) == storages  # no new copy
    for a, b in zip(first.qkv + first.gate_up, second.qkv + second.gate_up):
        assert a[0].data_ptr() == b[0].data_ptr() and a[0].shape == b[0].shape
        assert (a[1] is None) == (b[1] is None)
        if a[1] is not None:
            assert a[1].data_ptr() == b[1].data_ptr()
    assert layer.self_attn.q_proj.weight.data_ptr() == second.qkv[0][0].data_ptr()


def test_a_configuration_built_beside_another_answers_as_one_built_alone(tiny_dirs):
    """A reload's build (a Classifier on the serving one's loaded weights) shares the fused weights and
    answers exactly as a Classifier that loaded the model itself."""
    d = tiny_dirs["qwen3_qwentok"]
    serving = Classifier(tiny_cfg(d, PROMPTS))
    new_prompts = [prompt("colour", ["red", "blue", "none"]), prompt("fit", ["slim", "loose", "none"])]
    beside = Classifier(tiny_cfg(d, new_prompts), loaded=serving.loaded)
    assert fused_storages(beside.engine.dec) == fused_storages(serving.engine.dec)
    alone = Classifier(tiny_cfg(d, new_prompts))
    for got, want in zip(beside.classify(QUERIES), alone.classify(QUERIES)):
        for g, w in zip(got.prompts, want.prompts):
            assert g.label == w.label
            assert [s.label for s in g.labels] == [s.label for s in w.labels]
            assert max(abs(a.score - b.score) for a, b in zip(g.labels, w.labels)) < 1e-5
    before = serving.classify(QUERIES)  # the serving configuration is unchanged by the build beside it
    again = Classifier(tiny_cfg(d, PROMPTS)).classify(QUERIES)
    for got, want in zip(before, again):
        for g, w in zip(got.prompts, want.prompts):
            assert max(abs(a.score - b.score) for a, b in zip(g.labels, w.labels)) < 1e-5
