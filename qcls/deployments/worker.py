"""The engine side of a replica: one Classifier, one thread that owns the device, per-query failure isolation
and the health probe. Free of Ray and HTTP, so it is the same object under a handle, a route or a unit test.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from qcls.classifier import WARMUP_QUERY, Classifier
from qcls.results import QueryResult
from qcls.scoring.tokenization import QueryError, encode_query

log = logging.getLogger("qcls.serve")

# QueryResult.meta["error_kind"]: "query" = the query itself was refused (a 4xx over HTTP);
# "internal" = the engine raised while running it (a 5xx).
QUERY_ERROR, INTERNAL_ERROR = "query", "internal"
# Up to this many characters are tokenized on the event loop (well under a millisecond); a thread hop
# would cost more than it saves.
INLINE_CHARS = 4096


@dataclass
class Pending:
    """One query waiting for a batch; `arrived` (perf_counter) is when its request reached the replica."""

    query: str
    arrived: float


class EngineWorker:
    def __init__(self, clf: Classifier, probe_idle_s: float = 60.0, probe_timeout_s: float = 20.0):
        self.clf = clf
        self.max_batch = clf.cfg.engine.max_batch_size
        self._waiting: deque[tuple[Pending, asyncio.Future]] = deque()
        self._drainer: asyncio.Task | None = None
        # One thread: forwards on one device run one at a time, and never on the replica's event loop,
        # which keeps answering health checks and taking requests while a forward runs.
        self._device = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qcls-engine")
        self.probe_idle_s, self.probe_timeout_s = probe_idle_s, probe_timeout_s
        self.last_ok = time.monotonic()
        self.suspect: str | None = None  # an engine error since the last good forward: probe before trusting
        self.broken: str | None = None  # the probe failed: this replica cannot serve and must be replaced

    # -- queries -----------------------------------------------------------------------------------------

    def refusal(self, query: object) -> str | None:
        """Why `query` cannot be classified, or None. Bad queries are refused before they take a batch slot."""
        if not isinstance(query, str):
            return f"a query must be a string, got {type(query).__name__}"
        try:
            encode_query(self.clf.tokenizer, query, self.clf.cfg.max_query_tokens)
        except QueryError as e:
            return str(e)
        except Exception as e:  # e.g. a lone surrogate the tokenizer cannot take
            return f"query cannot be tokenized ({type(e).__name__}: {e})"
        return None

    async def refusals(self, queries: list) -> list[str | None]:
        if sum(len(q) for q in queries if isinstance(q, str)) <= INLINE_CHARS:
            return [self.refusal(q) for q in queries]
        # Tokenizing up to a body limit of text takes a while: keep it off the event loop.
        return await asyncio.to_thread(lambda: [self.refusal(q) for q in queries])

    def submit(self, items: list[Pending]) -> list[asyncio.Future]:
        """Queue queries for the device; each future resolves to its QueryResult.

        Ray Serve's batcher forms the next batch as soon as its first request arrives, even while the
        previous forward still runs, so under steady load its batches shrink towards one request each.
        Queries that arrive while the device is busy therefore wait here, and the next forward takes up
        to engine.max_batch_size of them together, whichever @serve.batch call they came from."""
        loop = asyncio.get_running_loop()
        futures = []
        for it in items:
            futures.append(loop.create_future())
            self._waiting.append((it, futures[-1]))
        if self._drainer is None or self._drainer.done():
            self._drainer = loop.create_task(self._drain())
        return futures

    async def _drain(self) -> None:
        while self._waiting:
            chunk = []
            while self._waiting and len(chunk) < self.max_batch:
                it, fut = self._waiting.popleft()
                if not fut.done():  # a cancelled request gives up its slot
                    chunk.append((it, fut))
            if not chunk:
                continue
            try:
                results = await self.run_batch([it for it, _ in chunk])
            except BaseException as e:  # never leave a caller waiting forever
                for _, fut in chunk:
                    if not fut.done():
                        fut.set_exception(e if isinstance(e, Exception) else RuntimeError("engine task cancelled"))
                if not isinstance(e, Exception):
                    raise
                continue
            for (_, fut), r in zip(chunk, results):
                if not fut.done():
                    fut.set_result(r)

    async def run_batch(self, items: list[Pending]) -> list[QueryResult]:
        """Classify one batch in one forward; a query that makes the engine raise fails alone."""
        start = time.perf_counter()
        queries = [it.query for it in items]
        if self.broken:
            results = [failed(q, f"engine unusable: {self.broken}") for q in queries]
        else:
            try:
                results = await self._on_device(self.clf.classify, queries)
                self._ok()
            except Exception as e:
                log.exception("batch of %d failed; retrying its queries one by one", len(queries))
                self.suspect = f"{type(e).__name__}: {e}"
                results = await self._one_by_one(queries)
        for it, r in zip(items, results):
            r.timings_ms["queue_wait"] = round((start - it.arrived) * 1e3, 4)
        return results

    async def _one_by_one(self, queries: list[str]) -> list[QueryResult]:
        out = []
        for q in queries:
            try:
                out.extend(await self._on_device(self.clf.classify, [q]))
                self._ok()
            except Exception as e:
                log.exception("query failed on its own")
                out.append(failed(q, f"internal error while classifying this query ({type(e).__name__}: {e})"))
        return out

    async def _on_device(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._device, fn, *args)

    def _ok(self) -> None:
        self.last_ok = time.monotonic()

    # -- health ------------------------------------------------------------------------------------------

    async def check(self) -> None:
        """Raise if the engine cannot answer. A real forward runs only after an engine error or a long idle
        spell: with traffic flowing, recent successes are the evidence and the check costs nothing."""
        if self.broken:
            raise RuntimeError(f"engine unusable: {self.broken}")
        if self.suspect is None and time.monotonic() - self.last_ok < self.probe_idle_s:
            return
        try:
            await asyncio.wait_for(self._on_device(self._probe), self.probe_timeout_s)
        except Exception as e:
            reason = (f"no answer within {self.probe_timeout_s:g}s" if isinstance(e, TimeoutError)
                      else f"{type(e).__name__}: {e}")
            self.broken = f"health probe failed ({reason}); last engine error: {self.suspect}"
            raise RuntimeError(f"engine unusable: {self.broken}") from None
        self.suspect = None
        self._ok()

    def _probe(self) -> None:
        r = self.clf.classify([WARMUP_QUERY])[0]
        if not r.ok:
            raise RuntimeError(r.error)
        bad = [p.prompt for p in r.prompts if not all(math.isfinite(s.score) for s in p.labels)]
        if bad:
            raise RuntimeError(f"non-finite scores for prompts {bad}")

    def close(self) -> None:
        self._device.shutdown(wait=False, cancel_futures=True)


def refused(query: str, why: str) -> QueryResult:
    return QueryResult(query=query, error=why, meta={"error_kind": QUERY_ERROR})


def failed(query: str, why: str) -> QueryResult:
    return QueryResult(query=query, error=why, meta={"error_kind": INTERNAL_ERROR})


def error_kind(r: QueryResult) -> str | None:
    """None for a good result; Classifier's own refusals (empty, too long) count as query errors."""
    return None if r.ok else r.meta.get("error_kind", QUERY_ERROR)
