"""Latency, memory and provenance of a sweep job: what the result says besides accuracy."""
from __future__ import annotations

import datetime as dt
import os
import statistics
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from qcls.eval.scores import Request, request_ms

if TYPE_CHECKING:
    import torch

REPO = Path(__file__).resolve().parents[2]


def percentiles(values: list[float]) -> dict[str, Any] | None:
    if not values:
        return None
    a = np.asarray(values, dtype=np.float64)
    return {"n": len(values), "p50": round(float(np.percentile(a, 50)), 4),
            "p90": round(float(np.percentile(a, 90)), 4)}


def latency(requests: list[Request], size: int) -> dict[str, Any] | None:
    """p50/p90 (ms) and median tokens per forward of the requests of exactly `size` queries."""
    sel = [r for r in requests if r.size == size]
    out = percentiles([r.ms for r in sel])
    if out is not None:
        out.update(batch_size=size, tokens_per_forward=int(statistics.median(r.tokens for r in sel)))
    return out


def time_batch1(clf, queries: list[str]) -> list[Request]:
    """Each query classified alone (one forward of one query), as a lone request would be."""
    out = []
    for q in queries:
        (r,) = clf.classify([q])
        if r.ok:
            out.append(Request(1, request_ms([r]), int(r.meta.get("tokens_per_forward", 0))))
    return out


def reset_peak() -> None:
    import torch  # here, not at the top: `qcls --version` reads commit() without loading torch
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def gpu_memory(device: torch.device) -> dict[str, Any] | None:
    """Allocated now and the peak since the job started (GiB); None off CUDA."""
    if device.type != "cuda":
        return None
    import torch
    gib = 2 ** 30
    return {"allocated_gib": round(torch.cuda.memory_allocated(device) / gib, 3),
            "peak_gib": round(torch.cuda.max_memory_allocated(device) / gib, 3)}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        import torch
        return torch.cuda.get_device_name(device)
    return f"cpu ({os.cpu_count()} cores)"


def commit() -> str:
    """git where the checkout has .git (+dirty when tracked files changed), else QCLS_BENCH_COMMIT (a copy
    without .git, e.g. on a device machine), as bench/common.py does."""
    if os.environ.get("QCLS_BENCH_COMMIT"):
        return os.environ["QCLS_BENCH_COMMIT"]
    if not (REPO / ".git").exists():  # an installed package: no checkout to ask
        return "unknown"
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=REPO, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=REPO, timeout=10).stdout.strip()
        return (sha or "unknown") + ("+dirty" if sha and dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
