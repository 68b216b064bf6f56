"""Response bodies of POST /v1/classify, written straight from the result dataclasses with orjson.

The pydantic models in `schemas` document the same shapes (OpenAPI) and a test checks that these bytes
validate against them; going through the models on every request (validate, then dump) cost a multiple of
this (bench/RESULTS.md). orjson writes every dataclass field, so fields added to qcls.results (the
head logits, say) reach the wire without a change here, and it writes NaN and infinity as null as
pydantic does.
"""
from __future__ import annotations

from typing import Any

import orjson

from qcls.results import PromptResult, QueryResult


def query_body(r: QueryResult) -> dict[str, Any]:
    """One result in the full form (schemas.QueryOut): every prompt with every label's score."""
    return {"query": r.query, "ok": r.error is None, "error": r.error, "query_tokens": r.query_tokens,
            "batch_size": r.batch_size, "timings_ms": r.timings_ms, "prompts": r.prompts, "meta": r.meta}


def compact_prompt(p: PromptResult) -> dict[str, Any]:
    out = {"prompt": p.prompt, "label": p.label, "prob": p.prob, "abstained": p.abstained}
    if p.raw_label is not None:  # a head or calibration is configured: the raw winner too
        out["raw_label"], out["raw_prob"] = p.raw_label, p.raw_prob
    return out


def compact_query_body(r: QueryResult) -> dict[str, Any]:
    """One result in the compact form (schemas.CompactQueryOut): each prompt's winner and its probability."""
    return {"query": r.query, "ok": r.error is None, "error": r.error, "batch_size": r.batch_size,
            "timings_ms": r.timings_ms, "prompts": [compact_prompt(p) for p in r.prompts]}


def classify_body(model: str, results: list[QueryResult], compact: bool = False) -> bytes:
    """`fingerprint`: the configuration that answered (one per request: qcls/deployments/app.py), None when no
    query was classified."""
    one = compact_query_body if compact else query_body
    fingerprint = next((r.meta.get("fingerprint") for r in results if r.error is None), None)
    return orjson.dumps({"model": model, "fingerprint": fingerprint, "results": [one(r) for r in results]},
                        default=str)
