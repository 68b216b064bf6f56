"""The short name of the configuration that produced an answer: a hash of everything that changes answers.

Every result carries it (`meta["fingerprint"]`, and the HTTP response's `fingerprint`), so a client can tell
which prompt set answered during a roll-out; the result cache keys by it. In it: the model and the backend
(weights, dtype, device), the prompts (templates, labels, label prefix and end), the scoring strategy, the
engine kind and the head or calibration file's content (not its path: a refitted file in the same place is
another configuration). Serving settings, batch sizes and limits are left out: they change which queries are
answered and how fast, not the answers.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from qcls.config import QclsConfig

LENGTH = 12  # hex digits: 48 bits, no collision among the handful of configurations a deployment ever sees


def answer_fingerprint(cfg: QclsConfig, head_path: str | None) -> str:
    """`head_path`: the head or calibration file the Classifier actually uses (None: no head)."""
    head = hashlib.sha256(Path(head_path).read_bytes()).hexdigest() if head_path else None
    parts = {"model": cfg.model.model_dump(mode="json", exclude={"head"}),
             "backend": cfg.backend.model_dump(mode="json"),
             "prompts": [p.model_dump(mode="json") for p in cfg.prompts],
             "strategy": cfg.strategy, "engine": cfg.engine.kind, "head": head,
             "layer_exit": cfg.engine.layer_exit}  # off: the answers carry the label scores too
    text = json.dumps(parts, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:LENGTH]
