"""The prediction log's writer on made-up results, without Ray or a model: the rows and their columns, sampling,
parts that appear whole, drops counted when the queue is full, Parquet, close writing what is queued, and the
folder's checks at start-up."""
from __future__ import annotations

import json
import random
import threading
from datetime import datetime

import pytest

from qcls.config import PredictionLogSpec
from qcls.errors import ConfigError, MissingPackageError
from qcls.predictions import log as plog
from qcls.predictions.log import PredictionLog, check_folder
from qcls.predictions.schema import LOG_FIELDS, prompt_columns
from qcls.results import LabelScore, PromptResult, QueryResult

PROMPTS = {"category": ["dress", "jeans"], "audience": ["boy", "girl", "none"]}
HUGE_S = 3600.0  # a flush interval no test reaches: only close() writes


@pytest.fixture(autouse=True)
def fast_ticks(monkeypatch):
    monkeypatch.setattr(plog, "TICK_S", 0.01)


def result(query: str, fingerprint: str = "fp0", hit: bool = False, error: str | None = None) -> QueryResult:
    if error:
        return QueryResult(query, error=error)
    prompts = []
    for name, labels in PROMPTS.items():
        probs = [1.0 / len(labels)] * len(labels) if name == "audience" else [0.75, 0.25]
        prompts.append(PromptResult(name, None if name == "audience" else labels[0], max(probs),
                                    [LabelScore(lab, None, p, 1) for lab, p in zip(labels, probs)],
                                    abstained=name == "audience"))
    return QueryResult(query, prompts, batch_size=0 if hit else 1, timings_ms={"in_replica": 1.5},
                       meta={"fingerprint": fingerprint, "cache": "hit" if hit else "miss"})


def spec(tmp_path, **kw) -> PredictionLogSpec:
    return PredictionLogSpec(folder=str(tmp_path / "log"), **({"flush_s": HUGE_S} | kw))


def read_parts(folder) -> list[list[dict]]:
    return [[json.loads(line) for line in p.read_text(encoding="utf-8").splitlines()]
            for p in sorted(folder.glob("part-*.jsonl"))]


@pytest.mark.parametrize("all_labels", [False, True])
def test_rows_hold_the_schemas_columns(tmp_path, all_labels):
    log = PredictionLog(spec(tmp_path, all_labels=all_labels), replica="r1")
    log.add([result("maxi dress"), result("", error="empty query"), result("maxi dress", hit=True)])
    log.close()
    [rows] = read_parts(tmp_path / "log")
    cols = [c for p, labels in PROMPTS.items() for c in prompt_columns(p, labels, all_labels)]
    time, query, fingerprint, cache_hit, latency = LOG_FIELDS
    assert [list(r) for r in rows] == [[time, query, fingerprint, *cols, cache_hit, latency]] * 2  # no refused row
    first, hit = rows
    assert (first[query], first[fingerprint], first[cache_hit], first[latency]) == ("maxi dress", "fp0", False, 1.5)
    assert hit[cache_hit] is True and datetime.fromisoformat(first[time]).utcoffset().total_seconds() == 0
    assert (first["pred:category"], first["pred:category:prob"], first["pred:category:abstained"]) == ("dress", 0.75,
                                                                                                      False)
    assert first["pred:audience"] is None and first["pred:audience:abstained"] is True
    if all_labels:
        assert (first["prob:category:dress"], first["prob:category:jeans"]) == (0.75, 0.25)
    assert [p.name for p in (tmp_path / "log").iterdir()] == ["part-r1-000000.jsonl"]  # no temporary file left
    assert (log.written, log.dropped) == (2, 0)


def test_a_reload_writes_the_new_configurations_rows_to_parts_of_their_own(tmp_path):
    log = PredictionLog(spec(tmp_path), replica="r1")
    log.add([result("a", "fp0"), result("b", "fp1"), result("c", "fp0")])
    log.close()
    parts = read_parts(tmp_path / "log")
    assert sorted([r["query"], r["fingerprint"]] for rows in parts for r in rows) == [["a", "fp0"], ["b", "fp1"],
                                                                                   ["c", "fp0"]]
    assert all(len({r["fingerprint"] for r in rows}) == 1 for rows in parts) and len(parts) == 2


def test_a_sample_keeps_each_answer_with_its_rate(tmp_path):
    random.seed(7)
    log = PredictionLog(spec(tmp_path, sample_rate=0.25), replica="r1")
    for i in range(200):
        log.add([result(f"q{i}") for _ in range(10)])
    log.close()
    n = sum(map(len, read_parts(tmp_path / "log")))
    assert n == log.written and 400 < n < 600  # 2,000 answers at 0.25: 500 ± 4.6 standard deviations


def test_a_reader_never_sees_half_a_part(tmp_path):
    """Parts written every tick while another thread reads every part file it finds, whole."""
    log = PredictionLog(spec(tmp_path, flush_s=0.01), replica="r1")
    folder, stop, seen, torn = tmp_path / "log", threading.Event(), set(), []

    def reader():
        while not stop.is_set():
            for p in folder.glob("part-*"):
                text = p.read_bytes()
                if not text.endswith(b"\n") or any(json.loads(x)["query"] != "q" for x in text.splitlines()):
                    torn.append(p.name)
                seen.add(p.name)
    t = threading.Thread(target=reader)
    t.start()
    for _ in range(300):
        log.add([result("q")] * 20)
        if len(seen) >= 5:
            break
        threading.Event().wait(0.002)
    log.close()
    stop.set()
    t.join()
    assert torn == [] and len(seen) >= 5
    assert sum(map(len, read_parts(folder))) == log.written and log.dropped == 0


def test_a_full_queue_drops_rows_and_counts_them(tmp_path, monkeypatch):
    gate, counts = threading.Event(), []
    real = PredictionLog._drain
    monkeypatch.setattr(PredictionLog, "_drain", lambda self: (gate.wait(), real(self)))  # the writer is stuck
    log = PredictionLog(spec(tmp_path, queue_rows=3), replica="r1", observer=lambda w, d: counts.append((w, d)))
    for i in range(10):
        log.add([result(f"q{i}")])  # never waits, whatever the writer does
    assert (len(log._queue), log.dropped) == (3, 7)
    gate.set()
    log.close()
    assert [r["query"] for rows in read_parts(tmp_path / "log") for r in rows] == ["q0", "q1", "q2"]
    assert tuple(map(sum, zip(*counts))) == (3, 7)


def test_parquet_parts(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    log = PredictionLog(spec(tmp_path, format="parquet", all_labels=True), replica="r1")
    log.add([result("maxi dress"), result("boys tee", hit=True)])
    log.close()
    [part] = (tmp_path / "log").glob("part-r1-*.parquet")
    t = pq.read_table(part)
    assert t.column("query").to_pylist() == ["maxi dress", "boys tee"]
    assert t.column("cache_hit").to_pylist() == [False, True] and t.schema.field("cache_hit").type == pa.bool_()
    assert t.schema.field("pred:category:prob").type == pa.float64() and t.column("pred:audience").to_pylist() == [
        None, None]
    assert t.column("prob:audience:girl").to_pylist() == pytest.approx([1 / 3] * 2)


def test_parts_continue_the_numbers_of_a_replica_of_the_same_name(tmp_path):
    folder = tmp_path / "log"
    folder.mkdir()
    (folder / "part-r1-000003.jsonl").write_text("kept\n")
    log = PredictionLog(spec(tmp_path), replica="r1")
    log.add([result("q")])
    log.close()
    assert (folder / "part-r1-000003.jsonl").read_text() == "kept\n" and (folder / "part-r1-000004.jsonl").exists()


def test_a_part_that_cannot_be_written_is_counted_and_serving_goes_on(tmp_path):
    counts = []
    log = PredictionLog(spec(tmp_path), replica="r1", observer=lambda w, d: counts.append((w, d)))
    (tmp_path / "log").rename(tmp_path / "gone")
    log.add([result("q"), result("r")])
    log.close()
    assert (log.written, log.lost) == (0, 2) and counts == [(0, 2)]


def test_the_folder_is_checked_at_start_up(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        check_folder(PredictionLogSpec(folder=str(tmp_path / "file")))
    with pytest.raises(ConfigError, match="cannot write there") as e:
        check_folder(PredictionLogSpec(folder=str(tmp_path / "file" / "sub")))
    assert "serve.prediction_log.folder=null" in str(e.value)
    (tmp_path / "mixed").mkdir()
    for name in ("notes.txt", "part-r1-000000.jsonl", ".part-r1-000001.jsonl.tmp"):
        (tmp_path / "mixed" / name).write_text("")
    with pytest.raises(ConfigError, match=r"holds files that are not prediction log parts: notes\.txt\n"):
        check_folder(PredictionLogSpec(folder=str(tmp_path / "mixed")))
    assert check_folder(PredictionLogSpec(folder=str(tmp_path / "new" / "log"))).is_dir()  # created
    monkeypatch.setitem(__import__("sys").modules, "pyarrow", None)
    with pytest.raises(MissingPackageError, match="format=parquet needs pyarrow") as e:
        check_folder(PredictionLogSpec(folder=str(tmp_path / "new" / "log"), format="parquet"))
    assert "serve.prediction_log.format=jsonl" in str(e.value)


def test_the_configs_checks(tmp_path, monkeypatch):
    from pydantic import ValidationError

    from qcls.config.compose import compose
    monkeypatch.chdir(tmp_path)
    assert PredictionLogSpec().folder is None  # off by default
    log = compose(["serve.prediction_log.folder=logs", "serve.prediction_log.format=parquet"]).serve.prediction_log
    assert log.folder == str(tmp_path / "logs") and log.format == "parquet"  # absolute where it is composed
    with pytest.raises(ConfigError, match="serve.prediction_log.sample_rate: Input should be greater than 0"):
        compose(["serve.prediction_log.sample_rate=0"])
    for bad, words in (({"sample_rate": 1.5}, "less than or equal to 1"), ({"format": "csv"}, "'jsonl' or 'parquet'"),
                       ({"queue_rows": 0}, "greater than or equal to 1"), ({"folder": " "}, "give a folder, or null"),
                       ({"flush_s": 0}, "greater than 0")):
        with pytest.raises(ValidationError, match=words):
            PredictionLogSpec(**bad)
