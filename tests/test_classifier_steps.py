"""A Classifier built in steps (Classifier.in_steps, as a replica's device owner runs a reload's build): one step
per device step, each saying what it did, and the same Classifier as one built at once."""
from __future__ import annotations

import pytest
import torch

from qcls.backends.registry import get_backend
from qcls.classifier import Classifier
from qcls.engine.bucket import token_buckets
from tests.conftest import prompt, tiny_cfg


PROMPTS = [prompt("a", ["x", "y"]), prompt("b", ["u", "v", "w"], system="Other.")]


@pytest.fixture(scope="module")
def cfg_and_weights(tiny_dirs):
    cfg = tiny_cfg(tiny_dirs["qwen3"], PROMPTS)
    return cfg, get_backend("fp16").load(cfg)


@pytest.fixture(scope="module")
def cuda_cfg_and_weights(tiny_dirs):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    cfg = tiny_cfg(tiny_dirs["qwen3"], PROMPTS, backend={"device": "cuda"})
    return cfg, get_backend("fp16").load(cfg)


def _run(steps) -> tuple[list[str], Classifier]:
    names = []
    while True:
        try:
            names.append(next(steps))
        except StopIteration as end:
            return names, end.value


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_build_in_steps_says_what_each_step_did_and_equals_one_built_at_once(device, request):
    """On a GPU also each bucket's two warm-up runs and two captures, a step each."""
    cfg, loaded = request.getfixturevalue("cfg_and_weights" if device == "cpu" else "cuda_cfg_and_weights")
    names, clf = _run(Classifier.in_steps(cfg, loaded=loaded))
    b = cfg.engine.max_batch_size
    keys = [(k, lt) for k in range(1, b + 1) for lt in token_buckets(cfg.engine.query_buckets, k)]
    assert sorted(clf.engine.buckets) == keys
    cuda, pool = clf.engine.device.type == "cuda", clf.engine.pool
    captures = [f"bucket {k}×{lt}: {what}" for k, lt in sorted(keys, key=lambda k: -clf.engine.buckets[k].n_tokens)
                for what in ("warm-up 1 of 2 before capture", "warm-up 2 of 2 before capture",
                             "forward graph captured", "tail graph captured")]
    warm = [f"bucket {k}×{lt}: warm-up request" for k, lt in keys for _ in range(cfg.engine.warmup_requests)]
    assert names == [
        "the configuration's checks and prompts", "the head's weight check", "the engine's buffers",
        *[f"prompt {p.name!r}: prefix fill ({sum(len(pool.blocks[k].tokens) for k in new)} tokens)"
          for p, new in zip(cfg.prompts, pool.new_blocks) if new],
        *[f"bucket {k}×{lt}: buffers and plan" for k, lt in keys],
        *(captures if clf.engine.graphs else []), *(warm if cuda else []),
        *[f"the request path at {k} queries" for k in range(1, b + 1)]]
    at_once = Classifier(cfg, loaded=loaded)
    queries = ["some query", "red shoes for men", "x"]
    for got, want in zip(clf.classify(queries), at_once.classify(queries)):
        assert got.ok and [[s.score for s in p.labels] for p in got.prompts] == \
            [[s.score for s in p.labels] for p in want.prompts]
    assert clf.fingerprint == at_once.fingerprint


def test_a_failed_step_ends_the_build_with_its_error(cfg_and_weights, monkeypatch):
    import qcls.engine.engine as engine

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA out of memory (a test's)")

    monkeypatch.setattr(engine, "Bucket", broken)
    cfg, loaded = cfg_and_weights
    steps = Classifier.in_steps(cfg, loaded=loaded)
    with pytest.raises(RuntimeError, match="a test's"):
        _run(steps)
    with pytest.raises(StopIteration):  # the build is over: nothing of it runs again
        next(steps)
    with pytest.raises(RuntimeError, match="a test's"):
        Classifier(cfg, loaded=loaded)
