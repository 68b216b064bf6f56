"""A build beside a serving configuration takes the device in turns (qcls/engine/turns.py): held from the engine
to the end of the warm-up, given way between its steps, released however the build ends."""
from __future__ import annotations

import pytest

from qcls.backends.registry import get_backend
from qcls.classifier import Classifier
from qcls.engine.bucket import token_buckets
from tests.conftest import prompt, tiny_cfg


class Recording:
    """Device turns (the replica worker's, in a real replica) that record what a build asks of them."""

    def __init__(self):
        self.log: list[str] = []

    def hold_device(self):
        self.log.append("hold")

    def give_way(self):
        self.log.append("give way")

    def release_device(self):
        self.log.append("release")


@pytest.fixture(scope="module")
def cfg_and_weights(tiny_dirs):
    cfg = tiny_cfg(tiny_dirs["qwen3"], [prompt("a", ["x", "y"]), prompt("b", ["u", "v", "w"], system="Other.")])
    return cfg, get_backend("fp16").load(cfg)


def test_the_build_holds_the_device_and_gives_way_between_its_steps(cfg_and_weights):
    cfg, loaded = cfg_and_weights
    turns = Recording()
    clf = Classifier(cfg, loaded=loaded, turns=turns)
    b = cfg.engine.max_batch_size
    buckets = sum(len(token_buckets(cfg.engine.query_buckets, n)) for n in range(1, b + 1))
    assert len(clf.engine.buckets) == buckets
    # each prompt's prefix fill, each bucket, each batch size of the warm-up's request path; on a GPU also each
    # bucket's capture (before it, and before each of its two graphs) and its warm-up requests
    cuda = clf.engine.device.type == "cuda"
    per_bucket = 1 + (3 if clf.engine.graphs else 0) + (cfg.engine.warmup_requests if cuda else 0)
    steps = len(cfg.prompts) + per_bucket * buckets + b
    # the head's weight check holds the device on its own (it copies weights off it), then the build
    assert turns.log == ["hold", "release", "hold"] + ["give way"] * steps + ["release"]
    assert clf.classify(["some query"])[0].ok


def test_a_failed_build_releases_the_device(cfg_and_weights, monkeypatch):
    import qcls.engine.engine as engine

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA out of memory (a test's)")

    monkeypatch.setattr(engine, "Bucket", broken)
    cfg, loaded = cfg_and_weights
    turns = Recording()
    with pytest.raises(RuntimeError, match="a test's"):
        Classifier(cfg, loaded=loaded, turns=turns)
    assert turns.log[-1] == "release" and turns.log.count("hold") == turns.log.count("release") == 2
