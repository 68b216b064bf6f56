"""The several-GPU benchmarks' verdicts (bench/replica_loss.py, bench/replicas.py) on
synthetic runs worked out by hand, so that a run on a lent GPU cannot end in a report that crashes or judges
wrongly. (The runs themselves: docs/serving.md, "Several GPUs".)"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("orjson")

from bench import replica_loss, replicas  # noqa: E402

A, B, NEW = "http://127.0.0.1:30000", "http://127.0.0.1:30001", "http://127.0.0.1:30002"


def loss_run():
    """2 replicas; A killed at t=20 (exited 20.1); the replacement NEW first answers at 40; t0=0, warm 0."""
    R = replica_loss.Row
    rows = [R(0, A, t, t + 0.5, 200) for t in range(10, 20)]  # 10 before the kill on A
    rows += [R(1, B, t, t + 0.5, 200) for t in range(10, 20)]  # 10 before on B
    rows += [R(0, A, 19.8, 20.1, "HTTPError: ConnectionResetError: reset"),  # in flight at the kill
             R(0, A, 20.05, 20.1, "HTTPError: IncompleteReadError: 0 bytes")]  # sent while it exited
    rows += [R(1, B, 20 + t, 20.5 + t, 200) for t in range(20)]  # B alone: 20 answers over [20.5, 39.5]
    rows += [R(0, NEW, 40 + t, 40 + t, 200) for t in range(10)] + [R(1, B, 40 + t, 40.5 + t, 200) for t in range(10)]
    out = {"t0": 0.0, "killed": 20.0, "exited": 20.1, "t_end": 50.0, "refused": 1,
           "doomed": {"url": A}, "replacement": {"url": NEW}, "replacement_running": 39.0,
           "replacement_answered": 40.0}
    a = SimpleNamespace(replicas=2, clients_per_replica=1, warm_s=0.0, before_s=10.0, after_s=10.0)
    return rows, out, a


def test_replica_loss_sorts_failures_and_rates():
    rows, out, a = loss_run()
    s = replica_loss.summarise(rows, out, a)
    assert (s["failed"], s["failed_in_flight_on_killed"], s["failed_sent_before_kill"]) == (2, 2, 1)
    assert s["failed_otherwise"] == [] and s["hung"] == 0
    assert s["rate_before"] == pytest.approx(20 / 20.0)  # answers ending in [0, 20): 20 over 20 s
    assert s["rate_outage"] == pytest.approx(20 / 19.9)  # B's 20 answers between the exit and 40
    assert s["replacement_answered_s"] == pytest.approx(20.0) and s["replacement_share_after"] == pytest.approx(0.5)
    text = replica_loss.report(s, a, {"device": "cpu", "config": "x"})
    assert "none hung: met" in text and "1 sent before the kill" in text and "50%" in text and "NOT met" not in text


def test_replica_loss_flags_a_failure_that_was_not_in_flight_and_a_hang():
    rows, out, a = loss_run()
    rows.append(replica_loss.Row(1, B, 30.0, 30.2, "HTTPError: ConnectionResetError: reset"))
    rows.append(replica_loss.Row(1, B, 31.0, 91.0, "hung over 60 s (hang guard)"))
    s = replica_loss.summarise(rows, out, a)
    assert len(s["failed_otherwise"]) == 2 and s["hung"] == 1
    assert "none hung: NOT met" in replica_loss.report(s, a, {"device": "cpu"})


def test_serve_replicas_goal_against_one_replica():
    def stat(n, path, rps):
        return {"path": path, "concurrency": 8 * n, "requests": 100, "errors": 0, "first_error": "", "rps": rps,
                "p50": 1.0, "p99": 2.0, "batch": 4.0, "client_cpu": 0.3}
    runs = {1: {"stats": [stat(1, "http (replica port)", 500), stat(1, "http (HAProxy)", 480)]},
            2: {"stats": [stat(2, "http (2 replica ports)", 900), stat(2, "http (Serve proxy)", 300)]},
            4: {"stats": [stat(4, "http (4 replica ports)", 1700), stat(4, "http (HAProxy)", 1850)]}}
    rs = replicas.rows(runs)
    assert [r["kind"] for r in rs] == ["ports", "haproxy", "ports", "proxy", "ports", "haproxy"]
    g = replicas.goals(rs, [1, 2, 4, 8], {1, 2, 4}, gpus=4, need_gpus=True)
    assert "N=2 replica ports: 900 req/s ≥ 0.9 × 2 × 500 (one replica's port) = 900: met" in "\n".join(g)
    assert any(x.startswith("N=4 replica ports") and "NOT met" in x for x in g)  # 1700 < 1800
    assert any(x.startswith("N=4 HAProxy: 1850 req/s") and ": met (92% of linear)" in x for x in g)
    assert any(x.startswith("N=1 HAProxy: 480 req/s") and "NOT met" not in x for x in g)  # 480 ≥ 450
    assert any(x.startswith("N=2 through Serve's proxy: 300 req/s = 30%") for x in g)
    assert not any(x.startswith("N=1 replica ports") for x in g)  # one replica is the yardstick itself
    assert "N=8: not measured: 8 replicas need 8 GPUs, 4 visible (no multi-GPU machine was lent)" in g
    assert "| 2 | http (2 replica ports) | 16 | 100 | 0 | 900.0 | 450.0 |" in replicas.table(rs)
