"""The joblib launcher (hydra-joblib-launcher, the `sweep` extra): jobs run in worker processes, so a
model is reused only by a later job of the same worker, and the result says which."""
from __future__ import annotations

import json
import os

import pytest

from qcls.sweep.sweep import main
from tests.eval.sweep_helpers import EVAL10, tiny, write_set

pytest.importorskip("hydra_plugins.hydra_joblib_launcher")


def test_joblib_launcher_runs_jobs_in_worker_processes(tiny_dirs, tmp_path):
    ev = write_set(tmp_path / "eval.jsonl", EVAL10[:4])
    out = tmp_path / "sweep"
    rc = main(["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "scoring=trie,exact",
               *tiny(tiny_dirs["qwen3"]), f"eval.path={ev}", "eval.batch1_queries=1",
               "eval.agreement_with_exact=false", f"hydra.sweep.dir={out}"])
    assert rc == 0
    results = [json.loads((out / f"{n}/result.json").read_text()) for n in (0, 1)]
    assert [r["status"] for r in results] == ["ok", "ok"], [r["reason"] for r in results]
    by_pid: dict[int, list[bool]] = {}
    for r in results:
        assert r["job"]["pid"] != os.getpid()  # not this process
        by_pid.setdefault(r["job"]["pid"], []).append(r["model_reused"])
    # each worker loads the model for its first job; a worker that takes both jobs reuses it for the second
    for flags in by_pid.values():
        assert sorted(flags) == [False] + [True] * (len(flags) - 1)
    assert (out / "summary.csv").is_file()
