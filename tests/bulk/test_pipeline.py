"""The bulk pipeline without a model: a fake Classifier whose device finishes batches only when the test says
so. The Feed never waits for the device in `add`/`pump`, keeps two batches in flight, and makes the batches a
one-shot run over the chunk's new distinct queries makes, however the chunk is sliced (what resume relies on);
process_chunk answers every row as before; the reader's slices keep chunk boundaries; the run leaves no frozen
objects behind; an Arrow table built in pieces equals one built at once."""
from __future__ import annotations

import gc
import random
from types import SimpleNamespace

import pytest

from qcls.results.cache import ResultCache
from qcls.bulk.outputs import Columns, Format
from qcls.bulk.pipeline import Feed, process_chunk
from qcls.bulk.progress import Tally
from qcls.query_files import Row
from qcls.bulk.runner import Slices
from qcls.results import LabelScore, PromptResult, QueryResult
from qcls.results.requests import Request, error_kind
from qcls.scoring.tokenization import QueryEncoder
from tests.results.test_requests import ByteTokenizer

PROMPTS = [("category", ("dress", "tee"))]


class FakeClassifier:
    """start() queues a batch; a batch is done once `release()` lets it be (or at once with auto=True);
    finish() of a batch that is not done is a test failure (the caller would have waited on the device)."""

    def __init__(self, step: int = 4, auto: bool = True):
        self.cfg = SimpleNamespace(engine=SimpleNamespace(max_batch_size=step))
        self.auto, self.batches, self.released, self.max_inflight, self.inflight = auto, [], 0, 0, 0
        self.waited = 0  # finish() calls that had to wait

    def open(self, queries):
        return Request.open(queries, QueryEncoder(ByteTokenizer(), 64), None, "fake")

    def start(self, queries):
        assert len(queries) <= self.cfg.engine.max_batch_size
        self.batches.append(list(queries))
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        return len(self.batches) - 1

    def done(self, b) -> bool:
        return self.auto or b < self.released

    def finish(self, b):
        if not self.done(b):
            self.waited += 1
            self.released = b + 1  # the device finishes it while the caller waits
        self.inflight -= 1
        return [_result(q) for q in self.batches[b]]

    def release(self, n: int = 1) -> None:
        self.released += n


@pytest.fixture(autouse=True)
def _unfreeze():
    """process_chunk freezes the garbage collector's view of every live object: give the other tests it back."""
    yield
    gc.unfreeze()


def _result(q: str) -> QueryResult:
    if not q.strip():
        return QueryResult(q, error="empty query: give at least one character")
    lab = "tee" if len(q) % 2 else "dress"
    return QueryResult(q, [PromptResult("category", lab, 0.75, [LabelScore("dress", 0.0, 0.5, 1),
                                                                  LabelScore("tee", 0.0, 0.5, 1)])])


def _rows(queries):
    return [Row(i + 1, {"query": q}, q) for i, q in enumerate(queries)]


def _log(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    vocab = [f"q{i}" for i in range(40)] + [" "]
    return rng.choices(vocab, [1 / (r + 1) for r in range(len(vocab))], k=n)


def test_add_and_pump_never_wait_and_two_batches_fly():
    clf = FakeClassifier(step=4, auto=False)
    feed = Feed(clf)
    feed.add([f"q{i}" for i in range(10)])  # two full batches go out; two queries wait for more or a flush
    assert clf.batches == [["q0", "q1", "q2", "q3"], ["q4", "q5", "q6", "q7"]] and len(feed.todo) == 2
    feed.add([f"q{i}" for i in range(10, 14)])
    feed.pump()
    assert len(clf.batches) == 2 and clf.waited == 0  # nothing finished: nothing collected, nothing queued
    clf.release()
    feed.pump()  # the first is done: collected, and the next full batch takes its place
    assert feed.answered == 4 and clf.batches[2] == ["q8", "q9", "q10", "q11"] and clf.waited == 0
    feed.flush()
    while feed.inflight:
        feed.wait()
    assert clf.batches[3] == ["q12", "q13"] and feed.answered == feed.added == 14
    assert clf.max_inflight == 2 and set(feed.results) == {f"q{i}" for i in range(14)}


@pytest.mark.parametrize("slice_rows", [1, 7, 64, 1000])
def test_batches_do_not_depend_on_the_slicing(slice_rows):
    """Full batches in order of first appearance, the remainder last: what one call over the chunk's new
    distinct queries gives, so a resumed run batches a chunk as the uninterrupted run did."""
    queries = _log(500, seed=1)
    cache = ResultCache(100)
    cache.absorb([("q0", (("dress",), (0.5,), None, (False,))), ("q3", (("tee",), (0.5,), None, (False,)))])
    new = list(dict.fromkeys(q for q in queries if cache.get(q) is None))
    one_shot = [new[i:i + 4] for i in range(0, len(new), 4)]
    clf = FakeClassifier(step=4)
    rows = _rows(queries)
    slices = [rows[i:i + slice_rows] for i in range(0, len(rows), slice_rows)]
    cols = Columns.build(["query"], PROMPTS, False)
    records, pairs = process_chunk(Feed(clf), slices, cols, cache, Tally(), ["category"])
    assert clf.batches == one_shot
    assert [r["query"] for r in records] == queries


def test_every_row_answered_from_the_cache_the_chunk_or_its_error():
    queries = _log(300, seed=2)
    cache = ResultCache(100)
    cached = (("dress",), (0.25,), None, (False,))  # differs from what the fake would say: must come from the cache
    cache.absorb([("q1", cached)])
    cols = Columns.build(["query"], PROMPTS, False)
    tally = Tally()
    rows = _rows(queries)
    records, pairs = process_chunk(Feed(FakeClassifier(step=3)), [rows[i:i + 16] for i in range(0, 300, 16)],
                                   cols, cache, tally, ["category"])
    for q, rec in zip(queries, records):
        if q == "q1":
            assert (rec["pred:category"], rec["pred:category:prob"], rec["error"]) == ("dress", 0.25, None)
        elif not q.strip():
            assert rec["pred:category"] is None and rec["error"].startswith("empty query")
        else:
            assert (rec["pred:category"], rec["pred:category:prob"], rec["error"]) == \
                (_result(q).prompts[0].label, 0.75, None)
    assert [q for q, _ in pairs] == [q for q in queries if q.strip()]
    distinct_new = {q for q in queries if q.strip() and q != "q1"}
    assert tally.rows == 300 and tally.classified == len(distinct_new)
    assert tally.cached == len(pairs) - len(distinct_new) and tally.errors["empty"] == queries.count(" ")


def test_a_waiting_reader_does_not_stall_the_finished_batches():
    """next_slice(block=False) may have nothing yet: the loop collects what the device finished meanwhile and
    asks again; it blocks on the reader only with nothing of its own on the device."""
    clf = FakeClassifier(step=2)
    script = [_rows(["a", "b", "c"]), [], [], _rows(["d", "e"]), [], None]
    asks = []

    def next_slice(block):
        asks.append(block)
        return script.pop(0)
    cols = Columns.build(["query"], PROMPTS, False)
    records, _ = process_chunk(Feed(clf), (), cols, ResultCache(10), Tally(), ["category"], next_slice=next_slice)
    assert [r["query"] for r in records] == ["a", "b", "c", "d", "e"]
    assert clf.batches == [["a", "b"], ["c", "d"], ["e"]] and not script


@pytest.mark.parametrize("n,chunk,slice_rows", [(0, 4, 2), (8, 4, 2), (9, 4, 2), (10, 4, 3), (5, 10, 3)])
def test_slices_keep_chunk_boundaries(n, chunk, slice_rows):
    rows = _rows([f"q{i}" for i in range(n)])
    src = Slices(iter(rows), chunk, slice_rows)
    got = []
    while src.next_chunk():
        parts = []
        while (s := src.get(True)) is not None:
            assert 0 < len(s) <= slice_rows
            parts.append(s)
        got.append([r for s in parts for r in s])
    assert got == [rows[i:i + chunk] for i in range(0, n, chunk)]


def test_a_reader_error_reaches_the_consumer():
    def rows():
        yield Row(1, {"query": "a"}, "a")
        raise ValueError("line 2: not UTF-8")
    src = Slices(rows(), 10, 1)
    assert src.next_chunk() and src.get(True)[0].query == "a"
    with pytest.raises(ValueError, match="line 2"):
        src.get(True)


def test_process_chunk_freezes_and_the_run_leaves_nothing_frozen(tmp_path, tiny_overrides, clf_factory, monkeypatch):
    """process_chunk freezes what it keeps alive (a full collection stalled the device); the run unfreezes it,
    also when it raises (a disk that fills up)."""
    from qcls.bulk import runner
    from qcls.bulk.options import BulkOptions
    cols = Columns.build(["query"], PROMPTS, False)
    process_chunk(Feed(FakeClassifier()), [_rows(["a", "b"])], cols, ResultCache(10), Tally(), ["category"])
    assert gc.get_freeze_count() > 0
    gc.unfreeze()
    inp = tmp_path / "log.txt"
    inp.write_text("red dress\nboys tee\n\n", encoding="utf-8")
    runner.run(BulkOptions(str(inp), str(tmp_path / "out.jsonl"), tiny_overrides, quiet=True), clf_factory)
    assert gc.get_freeze_count() == 0

    def disk_full(self, path, records):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(Format, "write_part", disk_full)
    with pytest.raises(OSError, match="No space"):
        runner.run(BulkOptions(str(inp), str(tmp_path / "out2.jsonl"), tiny_overrides, quiet=True), clf_factory)
    assert gc.get_freeze_count() == 0


def test_table_in_pieces_equals_one_piece(monkeypatch):
    pytest.importorskip("pyarrow")
    from qcls.bulk import outputs
    cols = Columns.build(["query", "id"], PROMPTS, True)
    recs = [cols.record({"query": f"q{i}", "id": i}, (("tee",), (0.5,), ((0.5, 0.5),), (False,)), None) for i in range(50)]
    fmt = Format("parquet", cols)
    whole = fmt.table(recs)
    monkeypatch.setattr(outputs, "TABLE_PIECE", 7)
    pieces = fmt.table(recs)
    assert pieces.to_pylist() == whole.to_pylist() and pieces.schema == whole.schema


def test_counts_grow_slice_by_slice_for_the_progress_line():
    """tick() after every written slice, with the rows and distinct queries counted so far (the progress line
    moves within a chunk, not once per 65,536 rows)."""
    queries = [f"q{i % 7}" for i in range(40)]
    rows = _rows(queries)
    tally, seen = Tally(), []
    cols = Columns.build(["query"], PROMPTS, False)
    process_chunk(Feed(FakeClassifier(step=2)), [rows[i:i + 10] for i in range(0, 40, 10)], cols, ResultCache(10),
                  tally, ["category"], tick=lambda: seen.append((tally.rows, tally.classified)))
    assert seen == [(10, 7), (20, 7), (30, 7), (40, 7)] and tally.cached == 33


def test_a_refused_query_is_answered_by_the_request_path_without_a_batch_slot():
    clf = FakeClassifier(step=2)
    feed = Feed(clf)
    mark = feed.add(["a", "  ", "b", "c"])
    assert clf.batches == [["a", "b"]] and list(feed.todo) == ["c"]  # the blank query took no slot
    assert error_kind(feed.results["  "]) == "empty" and feed.answered == 1  # answered at once
    feed.flush()
    while feed.inflight:
        feed.wait()
    assert feed.answered == mark == 4 and clf.batches == [["a", "b"], ["c"]]
