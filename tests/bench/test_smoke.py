"""Every command in bench's index runs: each CPU smoke run of bench/README.md's "Commands" table, as written
there, exits 0 and leaves bench/RESULTS.md as it was (QCLS_BENCH_RESULTS points the sections elsewhere). The
Ray benches join the session's cluster (RAY_ADDRESS), but for the HAProxy one. Each command is a process forked
from one that imported torch, transformers and qcls once (tests/forkserver.py)."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.forkserver import Forkserver

ROOT = Path(__file__).resolve().parents[2]
INDEX = ROOT / "bench" / "README.md"
STARTS_RAY = ("bench/load.py", "bench/replicas.py", "bench/replica_loss.py", "bench/bulk_ray.py")
# Serve reads its ingress flags when its processes start: the HAProxy run cannot join the session's cluster (direct
# ingress), so it starts a Ray of its own
OWN_RAY = ("bench/replicas.py",)


def smokes() -> list[str]:
    """The last cell of each row of the "Commands" table: one backticked command."""
    text = INDEX.read_text(encoding="utf-8").split("## Commands", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in text.splitlines() if ln.startswith("| `")]
    out = [re.fullmatch(r"\s*`([^`]+)`\s*", ln.rstrip(" |").rsplit(" | ", 1)[1]) for ln in rows]
    assert rows and all(out), "every row of bench/README.md's Commands table ends in one backticked smoke command"
    return [m.group(1) for m in out]


def test_the_index_lists_a_smoke_for_every_script():
    scripts = {p.stem for p in (ROOT / "bench").glob("*.py")} - {"__init__", "common", "paths", "http_client",
                                                                  "querylog", "compare", "load_ops"}
    named = {script(c) for c in smokes()}
    assert named == scripts


def script(command: str) -> str:
    return re.search(r"bench[./](\w+)", command).group(1)


def joins_ray(command: str) -> bool:
    return command.split()[1] in STARTS_RAY and command.split()[1] not in OWN_RAY


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}


@pytest.fixture(scope="module")
def python(tmp_path_factory) -> Path:
    """`python` for the smokes: each run a child of one process that imported what they all import."""
    tmp = tmp_path_factory.mktemp("forkserver")
    server = Forkserver(_env(), tmp)
    yield server.client(tmp / "bin", "python")
    server.close()


@pytest.mark.slow
@pytest.mark.parametrize("command", [pytest.param(c, id=script(c)) for c in smokes() if not joins_ray(c)])
def test_smoke_runs(command: str, tmp_path: Path, python: Path):
    smoke(command, tmp_path, python, {})


@pytest.mark.slow
@pytest.mark.parametrize("command", [pytest.param(c, id=script(c)) for c in smokes() if joins_ray(c)])
def test_ray_smoke_runs_on_the_sessions_cluster(command: str, tmp_path: Path, python: Path, ray_session):
    """The bench joins the session's cluster (RAY_ADDRESS) and leaves it as it found it."""
    smoke(command, tmp_path, python, {"RAY_ADDRESS": ray_session.address})


def smoke(command: str, tmp_path: Path, python: Path, env_extra: dict) -> None:
    argv = shlex.split(command)
    if argv[1] in STARTS_RAY:
        pytest.importorskip("ray", reason="the serving and Ray Data benches need ray: pip install -e '.[serve]'")
    assert argv[0] == "python"
    before = (ROOT / "bench" / "RESULTS.md").read_bytes()
    env = {**_env(), "QCLS_BENCH_RESULTS": str(tmp_path / "RESULTS.md"), "OUT": str(tmp_path / "out"), **env_extra}
    run = subprocess.run([str(python), *argv[1:]], cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, f"{command}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    assert "|---" in run.stdout  # it printed its table
    assert (ROOT / "bench" / "RESULTS.md").read_bytes() == before
