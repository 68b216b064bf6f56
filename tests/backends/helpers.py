"""Shared helpers for the backend tests: run a tiny or demo classifier and flatten its scores."""
from __future__ import annotations

import torch

from tests.conftest import prompt, tiny_cfg

QUERIES = ["red cotton hoodie for boy", "女士 dress 夏季", "cheap summer jeans", "man"]
PROMPTS = [prompt("category", ["dress", "jeans", "hoodie", "trench coat", "none"]),
           prompt("audience", ["boy", "girl", "man", "woman", "none"]),
           prompt("audience_zh", ["男童", "女童", "男士", "女士", "无"])]


def cfg(model_dir: str, backend: str = "fp16", options: dict | None = None, device: str = "auto", **extra):
    return tiny_cfg(model_dir, PROMPTS, backend={"name": backend, "options": options or {}, "device": device},
                    **extra)


def scores(clf, queries: list[str] = QUERIES) -> torch.Tensor:
    """[queries × every prompt's labels] scores, float64: the label scores, or the heads' logits where the forward
    stops at the heads' layer and computes none (a demo model with its default head)."""
    res = clf.classify(queries)
    assert all(r.error is None for r in res), [r.error for r in res]
    return torch.tensor([[lab.head_score if lab.score is None else lab.score for p in r.prompts for lab in p.labels]
                         for r in res], dtype=torch.float64)
