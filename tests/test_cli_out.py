"""Every command that writes a file takes `--out`: `qcls bulk INPUT --out OUTPUT` (OUTPUT may also follow INPUT),
`qcls sweep --out DIR`; calibrate, label-next and audit take it too (their own tests)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from qcls.errors import ConfigError
from qcls.sweep.sweep import main as sweep_main
from qcls.sweep.sweep import with_out
from tests.eval.sweep_helpers import EVAL10, tiny, write_set
from tests.test_cli import cli


def test_bulk_writes_the_file_named_by_out(tiny_overrides, tmp_path, capsys, monkeypatch):
    inp = tmp_path / "queries.csv"
    inp.write_text("query\nmens slim fit jeans\nhoodie for boys\n", encoding="utf-8")
    out = tmp_path / "labelled.csv"
    p = cli(["bulk", str(inp), "--out", str(out), "--quiet"], tiny_overrides, capsys, monkeypatch)
    assert p.returncode == 0, p.stderr
    header, *rows = out.read_text(encoding="utf-8").splitlines()
    assert header.startswith("query,") and "pred:category" in header and len(rows) == 2


@pytest.mark.parametrize("args", [["in.csv", "a.csv", "--out", "b.csv"], ["in.csv"], ["--out", "b.csv"]])
def test_bulk_wants_one_output(args, capsys, monkeypatch):
    p = cli(["bulk", *args], [], capsys, monkeypatch)
    assert p.returncode == 2 and "OUTPUT or --out OUTPUT (not both)" in p.stderr


def test_sweep_out_names_the_sweeps_folder(tiny_dirs, tmp_path):
    ev = write_set(tmp_path / "eval.jsonl", EVAL10[:2])
    out = tmp_path / "run"
    rc = sweep_main([*tiny(tiny_dirs["qwen3"]), f"eval.path={ev}", "eval.batch1_queries=0",
                     "eval.agreement_with_exact=false", "--out", str(out)])
    assert rc == 0 and json.loads((out / "result.json").read_text())["status"] == "ok"
    assert (out / "summary.md").is_file()


def test_sweep_out_and_a_hydra_folder_are_refused_together():
    assert with_out(["-m", "--out=d", "x=1"]) == ["-m", "x=1", "hydra.run.dir=d", "hydra.sweep.dir=d"]
    assert with_out(["x=1"]) == ["x=1"]
    with pytest.raises(ConfigError, match="both name the sweep's folder"):
        with_out(["--out", "d", "hydra.sweep.dir=e"])
    with pytest.raises(ConfigError, match="needs a folder"):
        with_out(["--out"])


def test_the_cli_passes_sweep_out_through(tmp_path):
    p = subprocess.run([sys.executable, "-m", "qcls.cli", "sweep", "--out", str(tmp_path / "a"), "hydra.run.dir=b"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "give one of them" in p.stderr
