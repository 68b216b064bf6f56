"""`qcls bulk --ray`: Ray Data with 2 CPU actors gives the single-process path's rows and errors, each distinct
query classified once (rows sorted by query hash) or streamed; an actor killed mid-run is restarted and the
output still has every row once; an existing cluster is joined with --address; actors that would take every
CPU are refused. On the session's Ray (tests/conftest.py `ray_session`)."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qcls.bulk import ray_runner, runner
from qcls.bulk.options import BulkOptions
from qcls.predictions.schema import prob_column
from tests.bulk.conftest import log_queries
from tests.bulk.test_runner import PROMPTS, write_log

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ray_cluster(ray_session):
    """The session's cluster (8 logical CPUs: 2 actors × 1 CPU and room for read and write tasks)."""
    pytest.importorskip("ray.data")
    return ray_session.address


def folder_rows(folder: Path) -> list[dict]:
    out = []
    for f in sorted(folder.iterdir()):
        if f.suffix == ".parquet":
            import pyarrow.parquet as pq
            out += pq.read_table(f).to_pylist()
        elif f.suffix == ".csv":
            with f.open(encoding="utf-8", newline="") as fh:
                out += list(csv.DictReader(fh))
        else:
            out += [json.loads(x) for x in f.read_text(encoding="utf-8").splitlines()]
    return out


def same(a: list[dict], b: list[dict]) -> None:
    """Same rows, labels and errors; probabilities to 1e-5 (an actor's batches hold other queries than the
    single process's, and a forward's last bits depend on its batch)."""
    key = lambda r: int(r["id"])  # noqa: E731
    a, b = sorted(a, key=key), sorted(b, key=key)
    assert [key(r) for r in a] == [key(r) for r in b]
    for x, y in zip(a, b):
        assert {k: v for k, v in x.items() if not k.endswith(":prob")} == \
               {k: v for k, v in y.items() if not k.endswith(":prob")}
        for c in map(prob_column, PROMPTS):
            if x[c] not in (None, ""):
                assert float(x[c]) == pytest.approx(float(y[c]), abs=1e-5)


def bad_log(tmp_path: Path, n: int, seed: int) -> tuple[Path, list[str]]:
    queries = log_queries(n, seed=seed)
    inp = tmp_path / "log.csv"
    write_log(inp, queries, "csv")
    with inp.open("ab") as f:  # a short record, a bad byte, one field too many
        f.write(f"{n}\n{n + 1},bad".encode() + b"\xff" + f",1\n{n + 2},a,1,extra\n".encode())
    return inp, queries


@pytest.mark.slow
@pytest.mark.parametrize("shuffle", [None, False], ids=["by-query", "streamed"])
def test_ray_two_actors_equal_single_process(tmp_path, tiny_overrides, clf_factory, ray_cluster, shuffle):
    inp, queries = bad_log(tmp_path, 500, seed=5)
    kw = dict(quiet=True, chunk_rows=100)
    single = runner.run(BulkOptions(str(inp), str(tmp_path / "one.csv"), tiny_overrides, **kw), clf_factory)
    opts = BulkOptions(str(inp), str(tmp_path / "ray.csv"), tiny_overrides, ray=True, actors=2, ray_batch_rows=128,
                       shuffle=shuffle, **kw)
    summary = ray_runner.run(opts)
    with (tmp_path / "one.csv").open(encoding="utf-8", newline="") as f:
        one = list(csv.DictReader(f))
    got = folder_rows(tmp_path / "ray.csv")
    assert [int(r["id"]) for r in got] == list(range(len(queries) + 3))  # every row once, in input order
    same(got, one)
    assert summary["rows"] == single["rows"] == len(queries) + 3 and summary["errors"] == single["errors"]
    assert {"missing", "undecodable", "malformed"} <= set(summary["errors"])
    # the pool starts beside the read: on a small input Ray Data may drop the second actor before it is ready
    assert summary["labels"] == single["labels"] and summary["actors_ready"] in (1, 2)
    assert (summary["pool_full_s"] is None) == (summary["actors_ready"] == 1) and summary["actor_restarts"] == 0
    assert sum(a["calls"] for a in summary["per_actor"]) == 4  # 503 rows in batches of 128, each once
    assert summary["shuffle"] == (shuffle is None)
    if shuffle is None:  # a query's rows lie together: only a query straddling two of the 4 batches may go twice
        assert single["classified"] <= summary["classified"] <= single["classified"] + 3
    assert not (tmp_path / "ray.csv.tmp").exists()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_rows_sorted_by_query_hash_lie_together(tmp_path, ray_cluster, fmt):
    """What several actors get: every row once, ordered by query hash, so each query's rows are one run."""
    import ray
    from qcls.query_files import Reader
    queries = log_queries(300, seed=9)
    inp = tmp_path / f"log.{fmt}"
    write_log(inp, queries, fmt)
    reader = Reader(inp)
    ds = ray_runner._rows(ray, BulkOptions(str(inp), str(tmp_path / "out.jsonl"), []), reader, True, 64).materialize()
    assert ds.num_blocks() >= 300 // 64  # blocks of a batch each: every actor can take some
    rows = ds.take_all()
    first = 2 if fmt == "csv" else 1  # a CSV's line numbers count its header
    assert sorted(r[ray_runner.LINE] for r in rows) == list(range(first, first + len(queries)))
    hashes = [r[ray_runner.HASH] for r in rows]
    assert hashes == sorted(hashes)
    col = ray_runner.QUERY if fmt == "csv" else "query"
    runs = [q for i, q in enumerate(r[col] for r in rows) if i == 0 or rows[i - 1][col] != q]
    assert len(runs) == len(set(runs))  # no query comes back after another one


@pytest.mark.slow
def test_an_actor_killed_mid_run(tmp_path, tiny_overrides, clf_factory, ray_cluster, monkeypatch):
    """The first actor to get a block SIGKILLs its own process (once: a marker file says it happened); Ray
    restarts it, the block is redone, and the output has every row once with the single process's results."""
    inp, queries = bad_log(tmp_path, 400, seed=8)
    marker = tmp_path / "killed"

    class Dying(ray_runner.BulkActor):
        def __call__(self, batch):
            if not marker.exists():
                marker.write_text(str(os.getpid()))
                os.kill(os.getpid(), 9)
            return super().__call__(batch)

    monkeypatch.setattr(ray_runner, "BulkActor", Dying)
    kw = dict(quiet=True, chunk_rows=100)
    runner.run(BulkOptions(str(inp), str(tmp_path / "one.csv"), tiny_overrides, **kw), clf_factory)
    summary = ray_runner.run(BulkOptions(str(inp), str(tmp_path / "ray.csv"), tiny_overrides, ray=True, actors=2,
                                         ray_batch_rows=128, **kw))
    with (tmp_path / "one.csv").open(encoding="utf-8", newline="") as f:
        one = list(csv.DictReader(f))
    got = folder_rows(tmp_path / "ray.csv")
    assert [int(r["id"]) for r in got] == list(range(len(queries) + 3))
    same(got, one)
    killed = int(marker.read_text())
    assert summary["rows"] == len(queries) + 3 and killed in [a["pid"] for a in summary["per_actor"]]
    # Ray restarted the killed actor as a new process, and the killed batch ran again there
    again = [a for a in summary["per_actor"] if a["restarted"]]
    assert summary["actor_restarts"] == len(again) == 1 and again[0]["pid"] != killed and again[0]["calls"] >= 1
    assert sum(a["calls"] for a in summary["per_actor"]) == 4  # 403 rows in batches of 128: the killed one once


@pytest.mark.slow
def test_an_empty_input_gives_an_empty_folder(tmp_path, tiny_overrides, ray_cluster):
    inp = tmp_path / "log.txt"
    inp.write_bytes(b"")
    summary = ray_runner.run(BulkOptions(str(inp), str(tmp_path / "out.jsonl"), tiny_overrides, ray=True, actors=2,
                                         quiet=True))
    assert summary["rows"] == 0 and (tmp_path / "out.jsonl").is_dir() and folder_rows(tmp_path / "out.jsonl") == []
    assert not (tmp_path / "out.jsonl.tmp").exists()


@pytest.mark.slow
def test_existing_cluster_through_the_cli(tmp_path, tiny_overrides, clf_factory, ray_cluster):
    queries = log_queries(200, seed=6)
    inp = tmp_path / "log.parquet"
    write_log(inp, queries, "parquet")
    runner.run(BulkOptions(str(inp), str(tmp_path / "one.parquet"), tiny_overrides, quiet=True), clf_factory)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "qcls.cli", "bulk", str(inp), str(tmp_path / "ray.parquet"), *tiny_overrides,
           "--address", ray_cluster, "--actors", "2", "--quiet"]
    subprocess.run(cmd, env=env, check=True, timeout=600)
    import pyarrow.parquet as pq
    one = pq.read_table(tmp_path / "one.parquet").to_pylist()
    got = folder_rows(tmp_path / "ray.parquet")
    assert [r["id"] for r in got] == list(range(len(queries)))  # hash-partitioned by query, sorted back
    same(got, one)
    assert isinstance(got[0]["id"], int)  # a Parquet input's column types pass through


@pytest.mark.slow
def test_actors_may_not_take_every_cpu(tmp_path, tiny_overrides, ray_cluster):
    inp = tmp_path / "log.txt"
    inp.write_text("red dress\n", encoding="utf-8")
    import ray
    cpus = int(ray.cluster_resources()["CPU"])
    opts = BulkOptions(str(inp), str(tmp_path / "out.jsonl"), tiny_overrides, ray=True, actors=cpus, quiet=True)
    with pytest.raises(ValueError, match=f"would take all {cpus} CPUs"):
        ray_runner.run(opts)


def test_bad_options_are_refused_before_ray_starts(tmp_path, tiny_overrides):
    """A wrong calibration file and --actors 0 are refused on the driver, with the way out, before any actor."""
    pytest.importorskip("ray")
    from qcls.heads.files import CalibrationError
    inp = tmp_path / "log.csv"
    write_log(inp, ["red dress"], "csv")
    with pytest.raises(CalibrationError, match="is not a head file"):
        ray_runner.run(BulkOptions(str(inp), str(tmp_path / "o.csv"), tiny_overrides + [f"calibration={inp}"],
                                   ray=True, quiet=True))
    with pytest.raises(ValueError, match="at least one actor"):
        ray_runner.run(BulkOptions(str(inp), str(tmp_path / "o.csv"), tiny_overrides, ray=True, actors=0, quiet=True))
    assert not (tmp_path / "o.csv").exists() and not (tmp_path / "o.csv.tmp").exists()
