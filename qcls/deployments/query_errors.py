"""What a replica answers for a query it does not classify: one refused before it takes a batch slot (the query
itself is at fault: a 4xx over HTTP) or one that made the engine raise (a 5xx); `error_kind` tells them apart."""
from __future__ import annotations

import asyncio

from qcls.results import QueryResult
from qcls.scoring.tokenization import QueryEncoder, QueryError

# QueryResult.meta["error_kind"]: "query" = the query itself was refused (a 4xx over HTTP);
# "internal" = the engine raised while running it (a 5xx).
QUERY_ERROR, INTERNAL_ERROR = "query", "internal"
# Up to this many characters are tokenized on the event loop (well under a millisecond); a thread hop
# would cost more than it saves.
INLINE_CHARS = 4096


def refusal(encoder: QueryEncoder, query: object) -> str | None:
    """Why `query` cannot be classified, or None. Bad queries are refused before they take a batch slot."""
    if not isinstance(query, str):
        return f"a query must be a string, got {type(query).__name__}"
    try:
        encoder(query)  # cached: the batch's own tokenize step finds it
    except QueryError as e:
        return str(e)
    except Exception as e:  # e.g. a lone surrogate the tokenizer cannot take
        return f"query cannot be tokenized ({type(e).__name__}: {e})"
    return None


async def refusals(encoder: QueryEncoder, queries: list) -> list[str | None]:
    if sum(len(q) for q in queries if isinstance(q, str)) <= INLINE_CHARS:
        return [refusal(encoder, q) for q in queries]
    # Tokenizing up to a body limit of text takes a while: keep it off the event loop.
    return await asyncio.to_thread(lambda: [refusal(encoder, q) for q in queries])


def refused(query: str, why: str) -> QueryResult:
    return QueryResult(query=query, error=why, meta={"error_kind": QUERY_ERROR})


def failed(query: str, why: str) -> QueryResult:
    return QueryResult(query=query, error=why, meta={"error_kind": INTERNAL_ERROR})


def error_kind(r: QueryResult) -> str | None:
    """None for a good result; Classifier's own refusals (empty, too long) count as query errors."""
    return None if r.ok else r.meta.get("error_kind", QUERY_ERROR)
