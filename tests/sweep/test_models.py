"""Reusing one loaded model across sweep jobs: engines built one after another on the same LoadedModel
score exactly as engines on a fresh load (the fast engine fuses QKV / gate-up weights into views of a new
tensor at each build, so a second build must still see the right weights)."""
from __future__ import annotations

import numpy as np
import torch

from qcls.classifier import Classifier
from qcls.sweep import models
from tests.conftest import prompt, tiny_cfg

PROMPTS = [prompt("kind", ["cat", "car", "boy"]), prompt("aud", ["boy", "girl", "man", "woman"])]
QUERIES = ["red cat toy", "a car for boys", "woman"]


def scores(clf: Classifier) -> np.ndarray:
    return np.array([[ls.score for p in r.prompts for ls in p.labels] for r in clf.classify(QUERIES)])


def test_engines_on_one_loaded_model_equal_fresh_loads(tiny_dirs):
    d = tiny_dirs["qwen3"]
    trie, exact = tiny_cfg(d, PROMPTS), tiny_cfg(d, PROMPTS, scoring={"name": "exact"})
    first = Classifier(trie)
    loaded = first.loaded
    s_trie = scores(first)
    q_before = loaded.model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    del first
    s_exact_reused = scores(Classifier(exact, loaded=loaded))
    s_trie_again = scores(Classifier(trie, loaded=loaded))  # a third build on the same, twice-fused weights
    assert torch.equal(loaded.model.model.layers[0].self_attn.q_proj.weight, q_before)
    np.testing.assert_allclose(s_trie_again, s_trie, rtol=0, atol=1e-6)
    s_exact_fresh = scores(Classifier(exact))
    np.testing.assert_allclose(s_exact_reused, s_exact_fresh, rtol=0, atol=1e-5)
    assert not np.allclose(s_exact_fresh, s_trie)  # the two strategies do differ: the comparison can fail


def test_model_cache_keys_on_weights_not_on_scoring(tiny_dirs):
    d = tiny_dirs["qwen3"]
    models.release()
    trie = tiny_cfg(d, PROMPTS)
    assert models.take(trie) is None
    sentinel = object()
    models.keep(trie, sentinel)
    # scoring, prompts, engine and calibration settings are built on top of the loaded model
    assert models.take(tiny_cfg(d, PROMPTS, scoring={"name": "exact"})) is sentinel
    assert models.take(tiny_cfg(d, PROMPTS[:1], engine={"max_batch_size": 2})) is sentinel
    # another dtype is another load: the held model is released first
    assert models.take(tiny_cfg(d, PROMPTS, backend={"dtype": "float16"})) is None
    assert models.take(trie) is None
    models.keep(trie, sentinel)
    assert models.take(tiny_cfg(tiny_dirs["llama"], PROMPTS)) is None  # another checkpoint
    models.release()
