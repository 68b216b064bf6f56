"""What a `qcls bulk --ray` run counts across its actors (qcls/bulk/ray_runner.py): one tally actor that every
BulkActor reports to when it is ready (who it is: process, node, GPUs, whether Ray restarted it) and after each
batch (its counts and busy time). The driver reads it for the progress line and the summary."""
from __future__ import annotations

import os
from collections import Counter

from qcls.bulk.progress import Tally


def actor_info() -> dict:
    """Who an actor is: its process, node and GPUs (the summary's per-actor lines; a bench kills by pid)."""
    import ray
    ctx = ray.get_runtime_context()
    return {"pid": os.getpid(), "node": ctx.get_node_id(), "gpus": [str(g) for g in ray.get_gpu_ids()],
            "restarted": bool(ctx.was_current_actor_reconstructed)}


def tally_actor(ray, actors: int):
    @ray.remote(num_cpus=0)
    class TallyActor:
        def __init__(self):
            self.tally, self.ready_at, self.last = Tally(), [], None  # ready_at: first starts, not restarts
            self.at_full: tuple[float, int, int] | None = None  # (time, rows, classified) when the N-th was ready
            self.actors: dict[str, dict] = {}  # "node:pid" → who it is and what it did

        def ready(self, t: float, info: dict) -> None:
            if not info["restarted"]:
                self.ready_at.append(t)
                if len(self.ready_at) == actors:
                    self.at_full = (t, self.tally.rows, self.tally.classified)
            self.actors[f"{info['node']}:{info['pid']}"] = {**info, "ready_at": t, "calls": 0, "rows": 0,
                                                            "classified": 0, "busy_s": 0.0, "first_at": None,
                                                            "last_at": None}

        def add(self, d: dict, t: float, key: str, busy_s: float) -> None:
            self.tally.merge(Tally(d["rows"], d["classified"], d["cached"], Counter(d["errors"]),
                                   {p: Counter(c) for p, c in d["labels"].items()}))
            self.last = t
            a = self.actors[key]
            a["calls"] += 1
            a["rows"] += d["rows"]
            a["classified"] += d["classified"]
            a["busy_s"] += busy_s
            a["first_at"] = a["first_at"] or t - busy_s
            a["last_at"] = t

        def snapshot(self):
            return self.tally, list(self.ready_at), self.last

        def counts_at_full(self) -> tuple[float, int, int] | None:
            return self.at_full

        def actor_stats(self) -> list[dict]:
            return sorted(self.actors.values(), key=lambda a: a["ready_at"])

    return TallyActor.remote()
