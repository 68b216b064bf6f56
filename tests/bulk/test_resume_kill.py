"""`qcls bulk` killed with SIGKILL at a random row (several seeds), then the same command again: the output
equals an uninterrupted run's, byte for byte (no row missing, none twice, the half-written part redone)."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.bulk.conftest import log_queries

REPO = Path(__file__).resolve().parents[2]
ARGS = ["--chunk-rows", "40", "--cache-size", "150", "--quiet"]


def command(inp, out, overrides):
    return [sys.executable, "-m", "qcls.cli", "bulk", str(inp), str(out), *overrides, *ARGS]


def env():
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_sigkill_at_random_rows_then_resume(tmp_path, tiny_overrides):
    inp = tmp_path / "log.jsonl"
    queries = log_queries(1600, seed=11, vocab=500)
    import json
    inp.write_text("".join(json.dumps({"n": i, "query": q}, ensure_ascii=False) + "\n" for i, q in enumerate(queries)),
                   encoding="utf-8")
    ref = tmp_path / "ref.jsonl"
    subprocess.run(command(inp, ref, tiny_overrides), env=env(), check=True, timeout=600)
    n_parts = -(-len(queries) // 40)
    for seed in range(3):
        rng = random.Random(seed)
        out = tmp_path / f"out{seed}.jsonl"
        parts = out.with_name(out.name + ".parts")
        want = rng.randrange(1, n_parts - 1)  # kill once this many parts exist, plus a random few ms
        proc = subprocess.Popen(command(inp, out, tiny_overrides), env=env())
        try:
            while proc.poll() is None and len(list(parts.glob("part-*.jsonl"))) < want:
                time.sleep(0.005)
            time.sleep(rng.random() * 0.05)
            assert proc.poll() is None, "the run ended before it could be killed"
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert not out.exists() and parts.is_dir()
        subprocess.run(command(inp, out, tiny_overrides), env=env(), check=True, timeout=600)
        assert out.read_bytes() == ref.read_bytes(), f"seed {seed}: killed after {want} parts"
        assert not parts.exists()
