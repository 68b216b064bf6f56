"""Prometheus metrics of a replica, through `ray.serve.metrics` (tagged with application, deployment and
replica). Ray exports them on each node's metrics port with a `ray_` prefix:

    ray_qcls_stage_ms{stage=tokenize|prepare|forward|score|postprocess|total}  histogram, once per forward
    ray_qcls_stage_ms{stage=queue_wait}                  histogram, once per query (arrival to its batch's start)
    ray_qcls_batch_size                                  histogram, queries per forward
    ray_qcls_tokens_per_forward                          histogram
    ray_qcls_queries_total                               counter, queries classified
    ray_qcls_refused_queries_total{reason}               counter: empty, too_long, not_a_string, untokenizable,
                                                         too_many_queries, body_too_large, bad_request
    ray_qcls_engine_errors_total{kind}                   counter: batch (a forward raised), query (a query
                                                         failed on its own), unusable (the health probe failed)
    ray_qcls_engine_healthy                              gauge, 1 while the engine answers, 0 once unusable
    ray_qcls_gc_pause_ms{generation}                     histogram, the replica's garbage-collector pauses
    ray_qcls_result_cache_hits_total / _misses_total     counters, queries answered from the result cache / not
    ray_qcls_result_cache_evictions_total                counter, entries dropped to stay within the bound
    ray_qcls_result_cache_entries                        gauge, entries held (0 after a reload)
    ray_qcls_reloads_total{outcome}                      counter: serving (a new configuration answers), refused
    ray_qcls_prediction_log_rows_total{outcome}          counter: written, dropped (a full queue, a failed write)

Recording runs on the replica's event loop after the batch's answers are handed back (`EngineWorker` calls
`after_batch` through loop.call_soon), so it does not delay them.
"""
from __future__ import annotations

from ray.serve.metrics import Counter, Gauge, Histogram

from qcls.gc_pauses import GcPauses
from qcls.results import STAGES, QueryResult

MS_BOUNDARIES = [0.25, 0.5, 1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 30, 50, 100, 200, 500, 1000, 5000]
TOKEN_BOUNDARIES = [16, 32, 64, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096]


def refusal_reason(message: str) -> str:
    """A short label for a refusal message (scoring.tokenization.refusal, the HTTP layer's errors)."""
    for words, reason in (("empty query", "empty"), ("max_query_tokens", "too_long"),
                          ("must be a string", "not_a_string"), ("cannot be tokenized", "untokenizable"),
                          ("max_queries_per_request", "too_many_queries"), ("max_body_bytes", "body_too_large")):
        if words in message:
            return reason
    return "bad_request"


class ReplicaMetrics:
    def __init__(self, max_batch_size: int):
        self.stage_ms = Histogram("qcls_stage_ms", description="per-query latency of each stage and of the "
                                  "wait for a batch (queue_wait), ms", boundaries=MS_BOUNDARIES,
                                  tag_keys=("stage",))
        self.batch_size = Histogram("qcls_batch_size", description="queries per forward",
                                    boundaries=[b + 0.5 for b in range(max_batch_size)])
        self.tokens = Histogram("qcls_tokens_per_forward", description="tokens in one forward (packed rows)",
                                boundaries=TOKEN_BOUNDARIES)
        self.queries = Counter("qcls_queries_total", description="queries classified")
        self.refused = Counter("qcls_refused_queries_total", description="queries refused, by reason",
                               tag_keys=("reason",))
        self.engine_errors = Counter("qcls_engine_errors_total", description="engine failures, by kind",
                                     tag_keys=("kind",))
        self.healthy = Gauge("qcls_engine_healthy", description="1 while the engine answers, 0 once unusable")
        self.healthy.set(1)
        self.gc_pause_ms = Histogram("qcls_gc_pause_ms", description="garbage-collector pauses of the replica "
                                     "process, ms", boundaries=MS_BOUNDARIES, tag_keys=("generation",))
        self.cache_hits = Counter("qcls_result_cache_hits_total", description="queries answered from the "
                                  "result cache (no forward)")
        self.cache_misses = Counter("qcls_result_cache_misses_total", description="queries the result cache did "
                                    "not hold (sent to the device)")
        self.cache_evictions = Counter("qcls_result_cache_evictions_total", description="result cache entries "
                                       "dropped to stay within engine.result_cache_entries")
        self.cache_entries = Gauge("qcls_result_cache_entries", description="entries in the result cache")
        self.cache_entries.set(0)
        self.reloads = Counter("qcls_reloads_total", description="reloads by outcome: serving (the new "
                               "configuration answers) or refused (the old one still does)", tag_keys=("outcome",))
        self.log_rows = Counter("qcls_prediction_log_rows_total", description="rows of the prediction log: written, "
                                "or dropped (its queue was full, or a part could not be written)", tag_keys=("outcome",))
        self.gc = GcPauses()
        self._gc_seen = 0  # pauses already exported (not from inside the collector's callback)

    def after_batch(self, results: list[QueryResult]) -> None:
        good = [r for r in results if r.ok]
        if not good:
            return
        first = good[0]  # stages are the batch's: every query of one forward carries the same
        for stage in (*STAGES, "total"):
            if stage in first.timings_ms:
                self.stage_ms.observe(first.timings_ms[stage], tags={"stage": stage})
        for r in good:
            self.stage_ms.observe(r.timings_ms.get("queue_wait", 0.0), tags={"stage": "queue_wait"})
        self.batch_size.observe(first.batch_size)
        tokens = first.meta.get("tokens_per_forward")
        if tokens:
            self.tokens.observe(tokens)
        self.queries.inc(len(good))
        self.export_gc()

    def export_gc(self) -> None:
        n = sum(self.gc.count)
        fresh = list(self.gc.recent)[-min(n - self._gc_seen, len(self.gc.recent)):] if n > self._gc_seen else []
        self._gc_seen = n
        for _start, ms, g in fresh:
            self.gc_pause_ms.observe(ms, tags={"generation": str(g)})

    def cache_use(self, hits: int, misses: int, evicted: int, entries: int | None) -> None:
        """One request's lookups; `entries` None when its configuration is no longer the active one."""
        if hits:
            self.cache_hits.inc(hits)
        if misses:
            self.cache_misses.inc(misses)
        if evicted:
            self.cache_evictions.inc(evicted)
        if entries is not None:
            self.cache_entries.set(entries)

    def cache_size(self, entries: int) -> None:
        self.cache_entries.set(entries)

    def reload_outcome(self, outcome: str) -> None:
        self.reloads.inc(tags={"outcome": outcome})

    def prediction_log_rows(self, written: int, dropped: int) -> None:
        """Called from the prediction log's writer thread (qcls/predictions/log.py) after each of its rounds."""
        for outcome, n in (("written", written), ("dropped", dropped)):
            if n:
                self.log_rows.inc(n, tags={"outcome": outcome})

    def refused_query(self, message: str) -> None:
        self.refused.inc(tags={"reason": refusal_reason(message)})

    def engine_error(self, kind: str) -> None:
        self.engine_errors.inc(tags={"kind": kind})
        if kind == "unusable":
            self.healthy.set(0)

    def health(self, ok: bool) -> None:
        """Refreshed at every health check: Ray drops a gauge series that is not set again for a while."""
        self.healthy.set(1 if ok else 0)
        self.export_gc()
