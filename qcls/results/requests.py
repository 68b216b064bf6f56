"""One call's queries on the request path, the same for every caller (`Classifier.classify`, a serving replica,
`qcls bulk`): `Request.open` answers at once each query that is refused (the query itself is at fault: a 4xx over
HTTP) or that this configuration answered before (the result cache), and leaves the rest to forwards; `close` puts
their answers in place and keeps them in the cache. A batch whose forward raises is retried query by query
(`start_batch`, `finish_batch`), and a query that still makes the engine raise gets a `failed` result (a 5xx);
`error_kind` names what went wrong, for a result and for the message alone (what a `qcls bulk` part file keeps).

`qcls bulk` opens its requests without the cache: its map of answered queries changes once per chunk, in input
order, so that a resumed run rebuilds it exactly from the parts already written (qcls/results/cache.py), where a
request's cache changes as its forwards finish."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from qcls.results.cache import ResultCache
from qcls.results.types import QueryResult
from qcls.scoring.tokenization import QueryEncoder, refusal

log = logging.getLogger("qcls")

# An error's kind by the start of its message: the one rule for a server's status code, `qcls bulk`'s summary and
# a resumed bulk run counting the rows of its part files. Every kind but "internal" is the query's own fault (a 4xx
# over HTTP; the undecodable, malformed and missing rows come from bulk's readers); "internal" = the engine raised
# while running it, or the engine is unusable (a 5xx).
INTERNAL_ERROR = "internal"
KINDS = (("empty query", "empty"), ("a query must be a string", "not_text"), ("not text:", "not_text"),
         ("query cannot be tokenized", "untokenizable"), ("undecodable bytes", "undecodable"),
         ("malformed:", "malformed"), ("missing:", "missing"), ("internal error", INTERNAL_ERROR),
         ("engine unusable", INTERNAL_ERROR))


def error_kind(error: QueryResult | str | None) -> str | None:
    """None for a good result; else the kind of its error, by its message (`too_long` by the limit it names,
    "other" for a message no rule knows). A `failed` result is internal whatever its message says."""
    if isinstance(error, QueryResult):
        if error.ok:
            return None
        if error.meta.get("error_kind") == INTERNAL_ERROR:
            return INTERNAL_ERROR
        error = error.error or ""
    if error is None:
        return None
    for prefix, kind in KINDS:
        if error.startswith(prefix):
            return kind
    return "too_long" if "over max_query_tokens" in error else "other"


def refused(query: str, why: str) -> QueryResult:
    return QueryResult(query=query, error=why, meta={"error_kind": error_kind(why)})


def failed(query: str, why: str) -> QueryResult:
    return QueryResult(query=query, error=why, meta={"error_kind": INTERNAL_ERROR})


@dataclass
class Request:
    queries: list
    results: list[QueryResult | None]  # per query, its answer once known
    cache: ResultCache | None  # (None: the call asked for no cache)
    fingerprint: str
    hits: int = 0
    evicted: int = 0  # cache entries evicted by `close`

    @classmethod
    def open(cls, queries: list, encoder: QueryEncoder, cache: ResultCache | None, fingerprint: str) -> "Request":
        why = [refusal(encoder, q) for q in queries]
        results: list[QueryResult | None] = [None if w is None else refused(q, w) for q, w in zip(queries, why)]
        req = cls(list(queries), results, cache if cache is not None and cache.size else None, fingerprint)
        if req.cache is not None:
            ok = [i for i, r in enumerate(results) if r is None]
            for i, hit in zip(ok, req.cache.lookup(fingerprint, [queries[i] for i in ok])):
                results[i] = hit
            req.hits = sum(results[i] is not None for i in ok)
        return req

    @property
    def todo(self) -> list[str]:
        """The queries a forward must answer, in order."""
        return [q for q, r in zip(self.queries, self.results) if r is None]

    def close(self, answers: list[QueryResult]) -> list[QueryResult]:
        """Every query's result: the answers of `todo`'s forwards in their places, kept in the cache."""
        fresh = iter(answers)
        out = [r if r is not None else next(fresh) for r in self.results]
        if self.cache is not None:
            self.evicted = self.cache.remember(self.fingerprint, answers)
        return out


def start_batch(clf, queries: list[str]):
    """`clf.start(queries)`, or the exception it raised (`finish_batch` then retries the queries one by one)."""
    try:
        return clf.start(queries)
    except Exception as e:  # noqa: BLE001 - handed to finish_batch
        return e


def finish_batch(clf, queries: list[str], started, on_error: Callable[[str, Exception], None] | None = None,
                 **finish) -> list[QueryResult]:
    """The results of a batch `start_batch` began; if its forward raised, each query again on its own, and one that
    still raises gets a `failed` result while the others proceed. `on_error(kind, error)` hears of each failure
    ("batch", then "query"); `finish`: Classifier.finish's options."""
    try:
        if isinstance(started, BaseException):
            raise started
        return clf.finish(started, **finish)
    except Exception as e:  # noqa: BLE001 - one query must not fail the others
        log.exception("a batch of %d failed; classifying its queries one by one", len(queries))
        if on_error is not None:
            on_error("batch", e)
    out = []
    for q in queries:
        try:
            out.extend(clf.finish(clf.start([q])))
        except Exception as e:  # noqa: BLE001
            log.exception("query failed on its own")
            if on_error is not None:
                on_error("query", e)
            out.append(failed(q, f"internal error while classifying this query ({type(e).__name__}: {e})"))
    return out
