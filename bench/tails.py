"""Where a load level's slowest requests lost their time (bench/load.py): the slowest 1 % split into queue
wait, engine and serving (the rest), and lined up with the garbage-collector pauses of the replica and of the
client process (qcls.deployments.metrics.GcPauses; perf_counter is one system-wide monotonic clock on Linux,
so both processes' timestamps compare)."""
from __future__ import annotations

import statistics

PAUSE_MS = 1.0  # a GC pause at least this long counts as a stall


def pauses_in(recent: list, t0: float, t1: float) -> list[tuple[float, float, int]]:
    return [p for p in recent if t0 <= p[0] <= t1]


def gc_delta(before: dict, after: dict, t0: float, t1: float) -> dict:
    """Pauses between two GcPauses summaries, those in [t0, t1] from the recent list."""
    count = [a - b for a, b in zip(after["count"], before["count"])]
    inside = pauses_in(after["recent"], t0, t1)
    return {"count": count, "total_ms": round(sum(a - b for a, b in zip(after["total_ms"], before["total_ms"])), 2),
            "max_ms": round(max((p[1] for p in inside), default=0.0), 2),
            "long": sum(p[1] >= PAUSE_MS for p in inside), "recent": inside}


def tail(lv, replica_gc: dict | None, client_gc: dict | None) -> dict:
    """The slowest 1 % (at least 3 rows) of a level: mean queue wait / engine / serving, and how many of them
    overlapped a GC pause ≥ PAUSE_MS in the replica or in the client."""
    if not lv.rows or len(lv.ends) != len(lv.rows):
        return {}
    order = sorted(range(len(lv.rows)), key=lambda i: lv.rows[i][0], reverse=True)
    slow = order[:max(3, len(order) // 100)]
    mean = lambda f: round(statistics.fmean(f(lv.rows[i]) for i in slow), 2)  # noqa: E731

    def overlapped(gc: dict | None) -> int:
        long = [p for p in (gc or {}).get("recent", []) if p[1] >= PAUSE_MS]
        return sum(any(p[0] < lv.ends[i] and p[0] + p[1] / 1e3 > lv.ends[i] - lv.rows[i][0] / 1e3 for p in long)
                   for i in slow)
    return {"n": len(slow), "ms": mean(lambda r: r[0]), "queue": mean(lambda r: r[3]), "engine": mean(lambda r: r[2]),
            "serving": mean(lambda r: r[0] - r[2] - r[3]), "replica_gc": overlapped(replica_gc),
            "client_gc": overlapped(client_gc)}


def tail_table(stats: list[dict]) -> str:
    rows = [s for s in stats if s.get("tail")]
    if not rows:
        return ""
    lines = ["Slowest 1 % of each level (mean ms) and garbage-collector pauses during it (count by generation, "
             f"longest ms, pauses ≥ {PAUSE_MS:g} ms; `with GC`: slow requests that overlapped one):", "",
             "| path | concurrency | slow requests | their ms | queue wait | engine | serving | replica GC | "
             "client GC | with replica GC | with client GC |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda g: f"{'/'.join(map(str, g['count']))}, max {g['max_ms']:.1f}, {g['long']} long" if g else "–"  # noqa: E731
    for s in rows:
        t = s["tail"]
        lines.append(f"| {s['path']} | {s['concurrency']} | {t['n']} | {t['ms']:.2f} | {t['queue']:.2f} | "
                     f"{t['engine']:.2f} | {t['serving']:.2f} | {fmt(s.get('gc_replica'))} | {fmt(s.get('gc_client'))} "
                     f"| {t['replica_gc']} | {t['client_gc']} |")
    return "\n".join(lines) + "\n"
