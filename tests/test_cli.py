"""The CLI end to end with the demo model: classify (table and --json), repl fed by a pipe, errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from qcls.cli import split_args

pytestmark = pytest.mark.slow


def run(args: list[str], overrides: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qcls.cli", args[0], *overrides, *args[1:]], input=stdin, text=True,
                          capture_output=True, timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_split_args():
    assert split_args(["red dress", "scoring=exact", "+x=1"], ["size=M"]) == (["red dress", "size=M"],
                                                                             ["scoring=exact", "+x=1"])


def test_classify_table_and_progress(demo_cfg_overrides):
    p = run(["classify", "mens slim fit jeans", "boys hoodie"], demo_cfg_overrides)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert out.count("query: ") == 2 and "category" in out and "audience" in out and "forward" in out
    assert "[qcls] loading" in p.stderr and "warm-up" in p.stderr  # progress on stderr only
    assert "[qcls]" not in out


def test_classify_json_and_bad_query(demo_cfg_overrides):
    p = run(["classify", "--json", "hoodie", "   ", "--", "size=M"], demo_cfg_overrides)
    assert p.returncode == 1  # one query was refused
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    assert [r["query"] for r in rows] == ["hoodie", "   ", "size=M"]
    good, bad, literal = rows
    assert good["ok"] and len(good["prompts"]) == 2 and bad["error"].startswith("empty query")
    cat = good["prompts"][0]
    assert cat["prompt"] == "category" and abs(sum(lab["prob"] for lab in cat["labels"]) - 1) < 1e-6
    assert cat["label"] == max(cat["labels"], key=lambda lab: lab["score"])["label"]
    assert set(good["timings_ms"]) == {"tokenize", "prepare", "forward", "score", "postprocess", "total"}
    assert literal["ok"]  # after `--`, key=value is a query


def test_repl_reads_a_pipe(demo_cfg_overrides):
    p = run(["repl", "--json"], demo_cfg_overrides, stdin="summer dress\n\nboys tee\n")
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    assert [r["query"] for r in rows] == ["summer dress", "boys tee"] and all(r["ok"] for r in rows)


def test_config_error_is_one_line_not_a_traceback(demo_cfg_overrides):
    p = run(["classify", "x"], demo_cfg_overrides + ["scoring=greedy"])
    assert p.returncode == 2 and "qcls: error:" in p.stderr and "Traceback" not in p.stderr


def test_help_lists_commands():
    p = subprocess.run([sys.executable, "-m", "qcls.cli", "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and all(c in p.stdout for c in ("classify", "repl", "serve"))
