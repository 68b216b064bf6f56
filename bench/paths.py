"""The ways a caller reaches the classifier, each driven the same way for bench/load.py: closed-loop clients,
single-query requests, bounded in requests and seconds. Every path yields per-request rows of
(client ms, queries in the forward, engine ms, queue wait ms)."""
from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field

import orjson

from bench.common import pct
from bench.http_client import HTTPError, KeepAliveClient

QUERIES = ["red cotton hoodie for boys", "maxi dress", "slim jeans men", "boys tee", "pregnant woman knit", "男童卫衣",
           "платье женское", "black trench coat women", "girls pleated skirt", "oversized knit"]
WARMUP_PER_CLIENT = 5
MIN_ENGINE_CALLS = 20


@dataclass
class Level:
    path: str
    concurrency: int
    rows: list[tuple[float, int, float, float]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0  # this process's CPU time meanwhile (all its threads): near wall_s, the client is the limit
    per_call: int = 1  # queries per call (the engine's batch rows)

    def stats(self) -> dict:
        lat = sorted(r[0] for r in self.rows)
        mean = lambda i: statistics.fmean(r[i] for r in self.rows) if self.rows else float("nan")  # noqa: E731
        n = len(self.rows) * self.per_call
        return {"path": self.path, "concurrency": self.concurrency, "requests": len(self.rows) + len(self.errors),
                "errors": len(self.errors), "first_error": self.errors[0] if self.errors else "",
                "rps": n / self.wall_s if self.wall_s else float("nan"),
                "p50": pct(lat, 50), "p90": pct(lat, 90), "p99": pct(lat, 99), "batch": mean(1),
                "engine": mean(2), "queue": mean(3),
                "serving": statistics.fmean(r[0] - r[2] - r[3] for r in self.rows) if self.rows else float("nan"),
                "client_cpu": self.cpu_s / self.wall_s if self.wall_s else float("nan")}


async def closed_loop(path: str, conc: int, make_call, max_requests: int, max_s: float,
                      queries: list[str] = QUERIES, until=None) -> Level:
    """`make_call(i)` gives client i a coroutine function q -> row (or raises with the error's text); the
    clients take `queries` in turn; `until` (a threading.Event) keeps them going after max_s until it is set."""
    lv, sent = Level(path, conc), 0
    calls = [await make_call(i) for i in range(conc)]

    async def warm(i: int) -> None:  # one request at a time per client: a keep-alive stream is sequential
        for k in range(WARMUP_PER_CLIENT):
            await calls[i](QUERIES[(i + k) % len(QUERIES)])
    await asyncio.gather(*(warm(i) for i in range(conc)))

    async def client(i: int) -> None:
        nonlocal sent
        while sent < max_requests and (time.perf_counter() < deadline or (until and not until.is_set())):
            q = queries[(sent + i) % len(queries)]
            sent += 1
            try:
                lv.rows.append(await calls[i](q))
            except Exception as e:  # noqa: BLE001 - every failure is counted and the first one reported
                lv.errors.append(f"{type(e).__name__}: {e}"[:300])

    t0, cpu0 = time.perf_counter(), time.process_time()
    deadline = t0 + max_s
    await asyncio.gather(*(client(i) for i in range(conc)))
    lv.wall_s, lv.cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    for c in calls:
        close = getattr(c, "close", None)
        if close:
            close()
    return lv


def http_caller(url: str | list[str]):
    """Client i POSTs to url, or with several (every replica's own port) to urls[i % len(urls)]: the clients
    spread evenly over the replicas. Rows end in (start time, the answering configuration's fingerprint,
    meta.cache)."""
    urls = [url] if isinstance(url, str) else list(url)

    async def make(i: int):
        client = KeepAliveClient(urls[i % len(urls)])

        async def call(q: str):
            body = orjson.dumps({"query": q})
            t0 = time.perf_counter()
            status, _h, data = await client.post("/v1/classify", body)
            ms = (time.perf_counter() - t0) * 1e3
            if status != 200:
                raise HTTPError(f"{status}: {data[:200].decode(errors='replace')}")
            body = orjson.loads(data)
            r = body["results"][0]
            return (ms, r["batch_size"], r["timings_ms"]["total"], r["timings_ms"]["queue_wait"], t0,
                    body.get("fingerprint"), r["meta"].get("cache"))
        call.close = client.close
        return call
    return make


def handle_caller(handle):
    async def make(_i: int):
        from qcls.cli.serve import classifier_handle
        h = classifier_handle(handle)  # plain pickle; made in the event loop that makes the calls

        async def call(q: str):
            t0 = time.perf_counter()
            [r] = await h.classify.remote([q])
            ms = (time.perf_counter() - t0) * 1e3
            if not r.ok:
                raise RuntimeError(r.error)
            return ms, r.batch_size, r.timings_ms["total"], r.timings_ms["queue_wait"]
        return call
    return make


def engine_levels(clf, max_requests: int, max_s: float) -> list[Level]:
    """Direct Classifier.classify calls in this process: one query (b1), and four (b4, its own best
    throughput: the engine takes at most engine.max_batch_size queries per forward)."""
    out = []
    for name, k in (("engine b1", 1), (f"engine b{clf.cfg.engine.max_batch_size}", clf.cfg.engine.max_batch_size)):
        batch_of = lambda i: [QUERIES[(i + j) % len(QUERIES)] for j in range(k)]  # noqa: E731
        for i in range(10):
            clf.classify(batch_of(i))
        lv, t_end = Level(name, 1, per_call=k), time.perf_counter() + max_s
        t0 = time.perf_counter()
        while len(lv.rows) < max_requests and (time.perf_counter() < t_end or len(lv.rows) < MIN_ENGINE_CALLS):
            s = time.perf_counter()
            r = clf.classify(batch_of(len(lv.rows)))[0]
            ms = (time.perf_counter() - s) * 1e3
            lv.rows.append((ms, r.batch_size, ms, 0.0))
        lv.wall_s = time.perf_counter() - t0
        out.append(lv)
    return out
