"""Shared pieces of the sweep tests: a tiny model's overrides and small labelled sets written per test."""
from __future__ import annotations

import json
from pathlib import Path

# prompts=default (category, audience); every query ≤ 16 tokens under the tiny byte tokenizer
EVAL10 = [
    ("red summer dress", {"category": "dress", "audience": "woman", "color": "red"}),
    ("mens slim jeans", {"category": "jeans", "audience": "man"}),
    ("boys hoodie", {"category": "hoodie", "audience": "boy"}),
    ("girls pink skirt", {"category": "skirt", "audience": "girl"}),
    ("white cotton tee", {"category": "tee"}),
    ("maternity dress", {"category": "dress", "audience": "pregnant"}),
    ("wool knit top", {"category": "knit", "audience": "none"}),
    ("beige trench coat", {"category": "trench"}),
    ("oxford shirt men", {"category": "shirt", "audience": "man"}),
    ("gift ideas", {"category": "none", "audience": "none"}),
]
FIT10 = [
    ("floral dress", {"category": "dress", "audience": "woman"}),
    ("dark jeans", {"category": "jeans", "audience": "none"}),
    ("kids hoodie boy", {"category": "hoodie", "audience": "boy"}),
    ("pleated skirt", {"category": "skirt", "audience": "woman"}),
    ("graphic tee men", {"category": "tee", "audience": "man"}),
    ("linen shirt", {"category": "shirt", "audience": "none"}),
    ("cable knit", {"category": "knit", "audience": "none"}),
    ("trench for women", {"category": "trench", "audience": "woman"}),
    ("socks", {"category": "other", "audience": "none"}),
    ("baby girl dress", {"category": "dress", "audience": "girl"}),
]


def tiny(model_dir: str) -> list[str]:
    """Overrides that point the sweep at a tiny local checkpoint with small buckets (tests/conftest FAST)."""
    # prompts=default first: the demo model's config picks few-shot prompts; a later prompts=… still wins
    return ["prompts=default", "model.source=local", f"model.path={model_dir}", "model.name=tiny", "model.head=null",
            "engine.query_buckets=[8,16]", "max_query_tokens=16", "engine.warmup_requests=1"]


def write_set(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps({"query": q, "labels": labels}, ensure_ascii=False) + "\n"
                            for q, labels in rows), encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
