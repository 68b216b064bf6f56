"""How deep the forward runs (qcls/heads/depth.py): the rule a Classifier, a reload and the playground share."""
from __future__ import annotations

import numpy as np

from qcls.heads.depth import BEYOND_WAY_OUT, Depth, plan_depth
from qcls.heads.head import Head, PromptHead, Read


def _head(layers: dict[str, int]) -> Head:
    return Head({name: PromptHead(["x", "y"], np.zeros(2), None, np.zeros((2, 4)), Read(layer, "position"))
                 for name, layer in layers.items()}, "learned", {})


def test_the_forward_stops_at_the_deepest_head_and_a_prompt_without_one_needs_every_layer():
    d = plan_depth(36, _head({"a": 9, "b": 20}), ["a", "b"])
    assert (d.layers, d.stops_early, d.loads_part) == (20, True, 20) and "prompt 'b'" in d.reason
    assert plan_depth(36, _head({"a": 9}), ["a", "b"]).layers == 36  # 'b' has no head
    assert plan_depth(36, _head({"a": 9}), ["a"], enabled=False).layers == 36
    assert plan_depth(36, _head({"a": 9}), ["a"], default_head=True).loads == 36  # loaded all, runs 9


def test_a_depth_beyond_the_loaded_layers_says_so():
    d = plan_depth(36, _head({"a": 9, "b": 20}), ["a", "b"])
    assert d.beyond(20) is None and d.beyond(36) is None
    why = d.beyond(12)
    assert why.startswith("this configuration reads 20 of the model's 36 decoder layers (") and "first 12" in why
    assert "engine.layer_exit=false" in BEYOND_WAY_OUT and Depth(36, 36, "r").beyond(12) is not None
