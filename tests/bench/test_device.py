"""bench/device.sh, dry: with `python` and `nvidia-smi` stand-ins that print what they are asked, every mode of
the index dispatches to its bench, `all` runs them all, and MODE@BASE refuses a base that was not prepared;
bench/compare.py's table on runs worked out by hand."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def dry(tmp_path: Path, *modes: str) -> subprocess.CompletedProcess:
    if not shutil.which("bash") or not shutil.which("timeout"):
        pytest.skip("bench/device.sh needs bash and coreutils' timeout")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name, body in (("python", 'echo "RAN $*"'), ("python3", 'echo "RAN $*"'), ("nvidia-smi", "echo H100")):
        (bin_ / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_ / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "OUT": str(tmp_path / "out")}
    return subprocess.run(["bash", "bench/device.sh", *modes], cwd=ROOT, env=env, capture_output=True, text=True)


def test_every_mode_of_the_index_runs_its_bench(tmp_path: Path):
    index = (ROOT / "bench" / "README.md").read_text(encoding="utf-8")
    modes = re.findall(r"^\| `(\w+)` \|", index, re.M)
    assert {"tests", "latency", "host", "serving", "replicas", "bulk", "backends", "ops"} <= set(modes)
    run = dry(tmp_path, "all")
    assert run.returncode == 0, run.stdout + run.stderr
    for m in modes:
        assert f"== {m}" in run.stdout, f"mode {m} did not run under all:\n{run.stdout}"
    for bench in ("bench/latency.py", "bench/host.py", "bench/load.py", "bench/bulk.py", "bench.backends", "-m gpu"):
        assert bench in run.stdout
    assert (tmp_path / "out" / "RESULTS.md").is_file() and (tmp_path / "out" / "logs.tgz").is_file()


def test_a_comparison_needs_its_base_checkout_and_an_unknown_mode_fails(tmp_path: Path):
    run = dry(tmp_path, "latency@0000000", "nonsense")
    assert run.returncode == 1
    assert "no " in run.stdout and "bash bench/device.sh prepare 0000000" in run.stdout
    assert "unknown mode nonsense" in run.stdout


def test_compare_table_against_the_mean_of_the_base_runs(tmp_path: Path, monkeypatch):
    from bench import compare

    def run(name: str, rps: float | None) -> Path:
        p = tmp_path / name
        if rps is not None:
            stats = [{"path": "engine b4", "concurrency": 1, "rps": 999.0},
                     {"path": "http (replica port)", "concurrency": 8, "rps": rps, "p50": 16.0, "p99": 40.0}]
            p.write_text(json.dumps({"stats": stats}))
        return p
    text = compare.table("serving", [run("b1.json", 90.0), run("new.json", 110.0), run("b2.json", 110.0)])
    # by hand: 110 / mean(90, 110) = 1.100; p50 16 / 16 = 1.000; the engine row is not HTTP: left out
    assert "| http (replica port) c=8, rps | 90.00 | 110.00 | 110.00 | 1.100 |" in text
    assert "| http (replica port) c=8, p50 | 16.00 | 16.00 | 16.00 | 1.000 |" in text and "engine" not in text
    text = compare.table("serving", [run("b1.json", 90.0), run("none.json", None), run("b2.json", 110.0)])
    assert "| http (replica port) c=8, rps | 90.00 | – | 110.00 | – |" in text and "No result from: none.json" in text
    raw = {"qwen3_4b": {"engine": {"8 prompts": {"b1_p50": 4.0, "b4_p50": 8.0}}}}
    assert compare.latency_metrics(raw) == {"qwen3_4b 8 prompts, b1 p50 ms": 4.0, "qwen3_4b 8 prompts, b4 p50 ms": 8.0}


def test_the_index_links_and_paths_resolve():
    """bench/README.md's links (the current figures' RESULTS.md sections: a heading's anchor, or an `<a id>` added
    before an old section) and backticked repository paths exist."""
    from tests.docs.markdown import anchors, code_paths, links
    index = ROOT / "bench" / "README.md"
    bad = []
    for line, target in links(index):
        file, _, anchor = target.partition("#")
        path = (index.parent / file).resolve()
        ids = anchors(path) | set(re.findall(r'<a id="([^"]+)"></a>', path.read_text(encoding="utf-8"))) \
            if path.suffix == ".md" and path.exists() else set()
        if not path.exists() or (anchor and anchor not in ids):
            bad.append(f"README.md:{line}: {target}")
    bad += [f"README.md:{line}: `{token}`" for line, token in code_paths(index) if not (ROOT / token).exists()]
    assert not bad, "\n".join(bad)


def test_lanes_run_their_modes_side_by_side_one_gpu_each(tmp_path: Path):
    run = dry(tmp_path, "lanes", "tests", "quick latency host")
    assert run.returncode == 0, run.stdout + run.stderr
    lane0, lane1 = run.stdout.split("#### lane 1 (GPU 1): quick latency host")
    assert "#### lane 0 (GPU 0): tests" in lane0 and "== tests" in lane0 and "== latency" not in lane0
    assert "== latency" in lane1 and "== host" in lane1 and "--iters 20" in lane1  # quick: the sizes of `all`
    assert (tmp_path / "out" / "RESULTS.md").is_file() and (tmp_path / "out" / "logs.tgz").is_file()


def test_the_log_alone_runs_only_the_prediction_log_rounds(tmp_path: Path):
    run = dry(tmp_path, "log")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "== ops-log" in run.stdout and "--prediction-log-ab 3 --seconds 20" in run.stdout
    assert "--reloads" not in run.stdout and "--zipf" not in run.stdout
