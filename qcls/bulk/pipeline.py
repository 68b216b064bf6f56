"""Distinct queries through one Classifier at the engine's rate: batches of engine.max_batch_size with two in
flight (`Classifier.start` queues a batch's forward behind the running one, so the host tokenizes and builds
results while the device works; the server's worker overlaps them the same way). Shared by the
single-process runner and the Ray Data actors.
"""
from __future__ import annotations

import logging
from collections import deque

from qcls.results import QueryResult

log = logging.getLogger("qcls.bulk")

ERROR_KINDS = ("empty", "too_long", "undecodable", "missing", "not_text", "malformed", "internal")


_PREFIXES = (("empty query", "empty"), ("undecodable bytes", "undecodable"), ("malformed:", "malformed"),
             ("missing:", "missing"), ("not text:", "not_text"), ("internal error", "internal"))


def error_kind(error: str) -> str:
    """The kind of a row's error, from its text (the readers' and the Classifier's messages; a resumed run
    counts the errors of its part files this way)."""
    for prefix, kind in _PREFIXES:
        if error.startswith(prefix):
            return kind
    return "too_long" if "over max_query_tokens" in error else "other"


def classify_distinct(clf, queries: list[str]) -> list[QueryResult]:
    """One result per query, in order. A batch whose forward raises is retried query by query, and a query
    that still raises gets an `internal error` result: the run goes on."""
    step = clf.cfg.engine.max_batch_size
    chunks = [queries[i:i + step] for i in range(0, len(queries), step)]
    out: list[QueryResult] = []
    inflight: deque[tuple[list[str], object]] = deque()
    for chunk in chunks:
        inflight.append((chunk, _start(clf, chunk)))
        if len(inflight) == 2:
            out += _finish(clf, *inflight.popleft())
    while inflight:
        out += _finish(clf, *inflight.popleft())
    return out


def _start(clf, chunk: list[str]):
    try:
        return clf.start(chunk)
    except Exception as e:  # noqa: BLE001 - retried one by one in _finish
        return e


def _finish(clf, chunk: list[str], batch) -> list[QueryResult]:
    try:
        if isinstance(batch, BaseException):
            raise batch
        return clf.finish(batch)
    except Exception:  # noqa: BLE001 - one query must not stop a file
        log.exception("a batch of %d failed; classifying its queries one by one", len(chunk))
        return [_one(clf, q) for q in chunk]


def _one(clf, q: str) -> QueryResult:
    try:
        return clf.classify([q])[0]
    except Exception as e:  # noqa: BLE001
        log.exception("query failed on its own")
        return QueryResult(query=q, error=f"internal error while classifying this query ({type(e).__name__}: {e})")
