"""A replica lost under load: N ≥ 2 replicas, 8 × N closed-loop clients, one replica killed (kill -9)
at full load, and what the clients saw until its replacement serves again.
The clients spread over the replicas' own ports as behind a load balancer with health checks (a refused
connection was never sent: it goes at once to another port; the replacement joins once Serve lists it RUNNING;
Serve's proxy and HAProxy on a lost replica: tests/deployments). Reported: every failed request and whether it
was in flight on the killed replica, hangs (--hang-s), the survivors' rate against (N−1)/N of the
rate before, the time to recovery. Appends to bench/RESULTS.md, writes replica_loss.json to $OUT when set.
"""
from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass

import orjson

from bench import common as C, load
from bench.http_client import HTTPError, KeepAliveClient
from bench.paths import QUERIES


@dataclass
class Row:
    client: int
    url: str
    start: float  # perf_counter
    end: float
    status: int | str  # HTTP status, or what went wrong


class Pool:
    """The replica ports the clients spread over (client i → the i-th of the ports in the pool)."""

    def __init__(self, app: str, prefix: str):
        self.app, self.prefix = app, prefix.rstrip("/")  # a replica's port serves its app under its route prefix
        self.urls, self.gone, self.seen = [], set(), {}  # seen: replica id -> (url, first RUNNING)

    def refresh(self) -> None:
        from qcls.testing.replicas import replicas
        for rid, r in replicas(self.app).items():
            if r.state == "RUNNING" and r.port and rid not in self.seen:
                self.seen[rid] = (f"http://127.0.0.1:{r.port}{self.prefix}", time.perf_counter())
        self.urls = sorted(u for u, _t in self.seen.values() if u not in self.gone)

    def pick(self, i: int) -> str | None:
        return self.urls[i % len(self.urls)] if self.urls else None

    def drop(self, url: str) -> None:
        self.gone.add(url)
        self.urls = [u for u in self.urls if u != url]


async def drive(a, app: str, prefix: str, out: dict) -> list[Row]:
    """The clients, the kill and the watch over Serve's replicas, until the replacement has served --after-s."""
    from qcls.testing.replicas import running, wait_exited

    n = a.replicas
    pool, rows, stop = Pool(app, prefix), [], asyncio.Event()
    first = await asyncio.to_thread(running, app, n, a.hang_s)
    await asyncio.to_thread(pool.refresh)
    out["refused"] = 0

    async def client(i: int) -> None:
        conns: dict[str, KeepAliveClient] = {}
        k = 0
        while not stop.is_set():
            url = pool.pick(i)
            if url is None:
                await asyncio.sleep(0.01)
                continue
            body = orjson.dumps({"query": QUERIES[(i + k) % len(QUERIES)]})
            k += 1
            c = conns.setdefault(url, KeepAliveClient(url))
            t0 = time.perf_counter()
            try:
                status, _h, _d = await asyncio.wait_for(c.post("/v1/classify", body), a.hang_s)
            except ConnectionRefusedError:  # nothing was sent: a load balancer retries it on another replica
                out["refused"] += 1
                pool.drop(url)
                continue
            except (HTTPError, OSError) as e:  # the connection broke with the request on it
                status = f"{type(e).__name__}: {e}"[:120]
            except asyncio.TimeoutError:
                c.close()
                status = f"hung over {a.hang_s:g} s (hang guard)"
            rows.append(Row(i, url, t0, time.perf_counter(), status))

    async def watch() -> None:
        while not stop.is_set():
            await asyncio.to_thread(pool.refresh)
            await asyncio.sleep(0.25)

    async def scenario() -> None:
        await asyncio.sleep(a.warm_s + a.before_s)
        doomed_id = sorted(first)[0]
        doomed = first[doomed_id]
        url = f"http://127.0.0.1:{doomed.port}{pool.prefix}"  # as the clients name it
        out["doomed"] = {"replica_id": doomed_id, "pid": doomed.pid, "url": url}
        os.kill(doomed.pid, signal.SIGKILL)
        out["killed"] = time.perf_counter()
        print(f"[loss] killed replica {doomed_id} (pid {doomed.pid}) at full load", flush=True)
        await asyncio.to_thread(wait_exited, doomed.pid)
        out["exited"] = time.perf_counter()
        deadline = out["killed"] + a.recovery_timeout_s
        new = None
        while new is None and time.perf_counter() < deadline:  # the replacement: a new replica id, RUNNING
            new = next((rid for rid in pool.seen if rid not in first), None)
            await asyncio.sleep(0.1)
        if new is None:
            print(f"[loss] no replacement RUNNING within {a.recovery_timeout_s:g} s", flush=True)
            return
        url, out["replacement_running"] = pool.seen[new]
        out["replacement"] = {"replica_id": new, "url": url}
        print(f"[loss] replacement {new} RUNNING {out['replacement_running'] - out['killed']:.1f} s after the kill",
              flush=True)
        while time.perf_counter() < deadline and not any(r.url == url and r.status == 200 for r in rows):
            await asyncio.sleep(0.05)  # its first answer
        served = [r.end for r in rows if r.url == url and r.status == 200]
        out["replacement_answered"] = min(served) if served else None
        back = out.get("replacement_answered") or out["replacement_running"]
        await asyncio.sleep(max(0.0, back + a.after_s - time.perf_counter()))

    out["t0"] = time.perf_counter()
    tasks = [asyncio.ensure_future(client(i)) for i in range(a.clients_per_replica * n)]
    watcher = asyncio.ensure_future(watch())
    try:
        await scenario()
    finally:
        out["t_end"] = time.perf_counter()
        stop.set()
        await asyncio.gather(*tasks, watcher)
    return rows


def summarise(rows: list[Row], out: dict, a) -> dict:
    n, ok = a.replicas, lambda r: r.status == 200  # noqa: E731
    killed, exited = out.get("killed"), out.get("exited")
    start = out["t0"] + a.warm_s

    def rate(t0: float, t1: float) -> float:
        return sum(ok(r) and t0 <= r.end < t1 for r in rows) / (t1 - t0) if t1 > t0 else float("nan")
    s = {"replicas": n, "clients": a.clients_per_replica * n, "requests": len(rows),
         "refused_connections_retried": out.get("refused", 0)}
    if killed is None:
        return s
    doomed = out["doomed"]["url"]
    back = out.get("replacement_answered") or out.get("replacement_running")
    failed = [r for r in rows if not ok(r)]
    in_flight = [r for r in failed if r.start < exited and r.end > killed and r.url == doomed]
    s.update({
        "failed": len(failed), "failed_in_flight_on_killed": len(in_flight),
        "failed_otherwise": [asdict(r) | {"start": r.start - killed, "end": r.end - killed}
                             for r in failed if r not in in_flight][:20],
        "hung": sum(isinstance(r.status, str) and r.status.startswith("hung") for r in rows),
        "failed_sent_before_kill": sum(r.start < killed for r in in_flight),  # the rest: sent while it exited
        "failure_kinds": sorted({":".join(str(r.status).split(":")[:2]) for r in failed}),
        "rate_before": rate(start, killed), "exit_ms": (exited - killed) * 1e3,
        "rate_outage": rate(exited, back) if back else rate(exited, out["t_end"]),
        "outage_s": (back or out["t_end"]) - exited,
        "replacement_running_s": out["replacement_running"] - killed if "replacement_running" in out else None,
        "replacement_answered_s": out["replacement_answered"] - killed if out.get("replacement_answered") else None,
    })
    if back:
        s["rate_after"] = rate(back, out["t_end"])
        url = out.get("replacement", {}).get("url")
        mine = sum(ok(r) and r.end >= back and r.url == url for r in rows)
        s["replacement_share_after"] = mine / max(1, sum(ok(r) and r.end >= back for r in rows))
    return s


def report(s: dict, a, header: dict) -> str:
    n = s["replicas"]
    lines = [f"## replica lost under load (bench/replica_loss.py), {header['device']}", "",
             f"- commit: {C.commit()}", *(f"- {k}: {v}" for k, v in header.items()),
             f"- {s['clients']} closed-loop clients over the replicas' own ports, one query per request; warm-up "
             f"{a.warm_s:g} s, {a.before_s:g} s before the kill, {a.after_s:g} s after the replacement answered", ""]
    if "failed" not in s:
        return "\n".join(lines + ["The kill did not happen (see the log).", ""]) + "\n"
    ok = lambda c: "met" if c else "NOT met"  # noqa: E731
    share = (n - 1) / n
    floor, back = share * s["rate_before"], s.get("replacement_share_after")
    lines += [
        "| requests | failed | in flight on the killed replica | other failures | hung | refused connections "
        "(retried at once) | rate before req/s | rate during the outage req/s | outage s | replacement RUNNING s "
        "| replacement's first answer s | rate after req/s | replacement's share after |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {s['requests']} | {s['failed']} | {s['failed_in_flight_on_killed']} | {len(s['failed_otherwise'])} | "
        f"{s['hung']} | {s['refused_connections_retried']} | {s['rate_before']:.1f} | {s['rate_outage']:.1f} | "
        f"{s['outage_s']:.1f} | {fmt(s['replacement_running_s'])} | {fmt(s['replacement_answered_s'])} | "
        f"{fmt(s.get('rate_after'))} | {fmt(s.get('replacement_share_after'), '.0%')} |", "",
        f"Failure kinds: {', '.join(f'`{k}`' for k in s['failure_kinds']) or 'none'}.", "", "Goals (a lost replica):",
        f"- only requests in flight on the killed replica failed ({s['failed_in_flight_on_killed']} of "
        f"{s['failed']}: {s['failed_sent_before_kill']} sent before the kill, the others in the "
        f"{s['exit_ms']:.0f} ms its process took to exit), none hung: "
        f"{ok(not s['failed_otherwise'] and not s['hung'])}",
        f"- the others kept serving at ≥ (N−1)/N of the rate before: {s['rate_outage']:.1f} ≥ {share:.2f} × "
        f"{s['rate_before']:.1f} = {floor:.1f} req/s: {ok(s['rate_outage'] >= floor)}",
        f"- time to recovery: RUNNING {fmt(s['replacement_running_s'])} s after the kill, first answer "
        f"{fmt(s['replacement_answered_s'])} s",
        f"- it takes traffic again: {fmt(back, '.0%')} of the answers after its first one (1/N = {1 / n:.0%}): "
        f"{ok((back or 0) > 0)}", ""]
    if s["failed_otherwise"]:
        lines += ["Other failures (times from the kill, s):", "", *(f"- {r}" for r in s["failed_otherwise"]), ""]
    return "\n".join(lines) + "\n"


def fmt(x, spec: str = ".1f") -> str:
    return "–" if x is None else format(x, spec)


def main(argv=None) -> int:
    ap = C.parser(__doc__)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides (serve.num_replicas=N ≥ 2, model, num_gpus …)")
    ap.add_argument("--clients-per-replica", type=int, default=8)
    ap.add_argument("--warm-s", type=float, default=3.0, help="load before the measured window")
    ap.add_argument("--before-s", type=float, default=10.0, help="measured full load before the kill")
    ap.add_argument("--after-s", type=float, default=10.0, help="load after the replacement's first answer")
    ap.add_argument("--recovery-timeout-s", type=float, default=300.0, help="give up on the replacement after this")
    ap.add_argument("--hang-s", type=float, default=60.0, help="a request this long counts as hung (hang guard)")
    ap.add_argument("--random-qwen3", choices=["qwen3_4b", "qwen3_8b", "tiny"])
    a = ap.parse_args(argv)
    overrides = load.app_overrides(a.random_qwen3, a.overrides)
    from qcls.config.compose import compose
    cfg = compose(overrides)
    a.replicas = cfg.serve.num_replicas
    if a.replicas < 2 or cfg.serve.autoscaling or cfg.serve.ingress != "direct":
        ap.error("needs serve.num_replicas=N ≥ 2, no serve.autoscaling, serve.ingress=direct")
    import ray
    from ray import serve

    from qcls.cli.serve import serve_main
    serve_main(overrides, blocking=False)
    out: dict = {}
    try:
        rows = asyncio.run(drive(a, cfg.serve.app_name, cfg.serve.route_prefix, out))
    finally:
        serve.delete(cfg.serve.app_name) if C.joined_ray() else serve.shutdown()
        ray.shutdown()
    s = summarise(rows, out, a)
    header = {"device": load.describe_device(cfg), "overrides": " ".join(overrides), "config": load.config_line(cfg)}
    C.report(report(s, a, header), a.no_append, "replica_loss", {"summary": s, "header": header})
    return 0 if "failed" in s and not s["failed_otherwise"] and not s["hung"] else 1


if __name__ == "__main__":
    sys.exit(main())
