"""One Classifier per config for the whole session (runner.run takes a factory, so no test loads a model twice; the
tiny model's overrides: tests/conftest.py `tiny_overrides`)."""
from __future__ import annotations

import random

import pytest

WORDS = ["red", "dress", "jeans", "boys", "hoodie", "slim", "tee", "knit", "女装", "skirt", "mens", "midi"]


@pytest.fixture(scope="session")
def clf_factory():
    """cfg → a Classifier built once per distinct config."""
    from qcls.classifier import Classifier
    built: dict[str, object] = {}

    def make(cfg):
        key = cfg.model_dump_json()
        if key not in built:
            built[key] = Classifier(cfg)
        return built[key]
    return make


def log_queries(n: int, seed: int = 0, vocab: int = 60) -> list[str]:
    """A query log with Zipf-like repeats: `vocab` distinct short queries (≤ 16 bytes), rank r drawn with
    weight 1/r; a few bad rows mixed in (empty, too long)."""
    rng = random.Random(seed)
    distinct = []
    while len(distinct) < vocab:
        q = " ".join(rng.sample(WORDS, rng.randint(1, 2)) + [str(rng.randint(1, 99))] * rng.randint(0, 1))
        if len(q.encode()) <= 16 and q not in distinct:
            distinct.append(q)
    weights = [1 / (r + 1) for r in range(vocab)]
    out = rng.choices(distinct, weights, k=n)
    for i in rng.sample(range(n), max(1, n // 50)):
        out[i] = rng.choice(["", "   ", "x" * 40])
    return out
