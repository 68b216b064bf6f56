"""The single-process bulk run on a tiny random-weight model: every format in and out with pass-through
columns, repeats classified once yet every row answered as without dedupe, error rows of every kind, batch
sizes past 4, and resume from an interrupted run (parts, a half-written part, the join) byte for byte."""
from __future__ import annotations

import csv
import json

import pytest

from qcls.bulk import runner
from qcls.bulk.options import BulkOptions
from qcls.bulk.outputs import Format
from qcls.predictions.schema import label_column, label_prob_column, prob_column
from tests.bulk.conftest import log_queries

PROMPTS = ["category", "audience"]


def write_log(path, queries, fmt):
    ids = list(range(len(queries)))
    if fmt == "txt":
        path.write_text("".join(q + "\n" for q in queries), encoding="utf-8")
    elif fmt in ("csv", "tsv"):
        with path.open("w", encoding="utf-8", newline="") as f:
            w = csv.writer(f, delimiter="\t" if fmt == "tsv" else ",")
            w.writerow(["id", "query", "count"])
            w.writerows([i, q, i % 3] for i, q in zip(ids, queries))
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps({"id": i, "query": q, "count": i % 3}, ensure_ascii=False) + "\n"
                                for i, q in zip(ids, queries)), encoding="utf-8")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.table({"id": ids, "query": queries, "count": [i % 3 for i in ids]}), path)


def read_out(path):
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq
        return pq.read_table(path).to_pylist()
    if path.suffix in (".csv", ".tsv"):
        with path.open(encoding="utf-8", newline="") as f:
            return list(csv.DictReader(f, delimiter="\t" if path.suffix == ".tsv" else ","))
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


def results(recs):
    """(labels, probs, error) per row, whatever the format wrote them as."""
    def f(v):
        return None if v in (None, "") else float(v)
    return [(tuple(r[label_column(p)] or None for p in PROMPTS), tuple(f(r[prob_column(p)]) for p in PROMPTS),
             r["error"] or None) for r in recs]


def bulk(tmp_path, tiny_overrides, clf_factory, inp, out, **kw):
    opts = BulkOptions(str(inp), str(tmp_path / out), tiny_overrides, quiet=True, **kw)
    return runner.run(opts, clf_factory), tmp_path / out


@pytest.fixture(scope="module")
def queries():
    return log_queries(300, seed=3)


@pytest.mark.slow
def test_every_input_format_same_results_and_passthrough(tmp_path, tiny_overrides, clf_factory, queries):
    got = {}
    for fmt in ("txt", "csv", "tsv", "jsonl", "parquet"):
        inp = tmp_path / f"log.{fmt}"
        write_log(inp, queries, fmt)
        summary, out = bulk(tmp_path, tiny_overrides, clf_factory, inp, f"out_{fmt}.jsonl", chunk_rows=64)
        recs = read_out(out)
        assert [r["query"] for r in recs] == queries and summary["rows"] == len(queries)
        if fmt != "txt":
            assert [str(r["id"]) for r in recs] == [str(i) for i in range(len(queries))]
            assert [str(r["count"]) for r in recs] == [str(i % 3) for i in range(len(queries))]
        got[fmt] = results(recs)
        assert not runner.parts_dir(out).exists()
    assert all(v == got["txt"] for v in got.values())
    assert isinstance(read_out(tmp_path / "out_jsonl.jsonl")[0]["id"], int)  # JSONL keeps the input's types


@pytest.mark.slow
@pytest.mark.parametrize("ext", [".csv", ".tsv", ".parquet"])
def test_every_output_format(tmp_path, tiny_overrides, clf_factory, queries, ext):
    inp = tmp_path / "log.jsonl"
    write_log(inp, queries, "jsonl")
    _, ref = bulk(tmp_path, tiny_overrides, clf_factory, inp, "ref.jsonl", chunk_rows=64)
    _, out = bulk(tmp_path, tiny_overrides, clf_factory, inp, "out" + ext, chunk_rows=64)
    recs = read_out(out)
    assert results(recs) == results(read_out(ref))
    assert [str(r["id"]) for r in recs] == [str(i) for i in range(len(queries))]


@pytest.mark.slow
def test_repeats_classified_once_rows_as_without_dedupe(tmp_path, tiny_overrides, clf_factory, queries):
    inp = tmp_path / "log.txt"
    write_log(inp, queries, "txt")
    summary, out = bulk(tmp_path, tiny_overrides, clf_factory, inp, "out.jsonl", chunk_rows=100, all_labels=True)
    recs = read_out(out)
    from qcls.config.compose import compose
    clf = clf_factory(compose(tiny_overrides))
    distinct = {q for q in queries if q.strip() and len(q) <= 16}
    assert summary["classified"] == len(distinct) and summary["rows"] == len(queries)
    assert summary["cached"] == sum(1 for q in queries if q in distinct) - len(distinct)
    one_by_one = {q: clf.classify([q])[0] for q in set(queries)}  # batch 1 each: no dedupe, no batching
    for q, rec in zip(queries, recs):
        r = one_by_one[q]
        assert (rec["error"] is None) == r.ok and (r.ok or rec["error"] == r.error)
        for p in r.prompts:
            assert rec[label_column(p.prompt)] == p.label
            assert rec[prob_column(p.prompt)] == pytest.approx(p.prob, abs=1e-5)
            for s in p.labels:
                assert rec[label_prob_column(p.prompt, s.label)] == pytest.approx(s.prob, abs=1e-5)
    assert sum(summary["labels"]["category"].values()) == sum(1 for q in queries if q in distinct)


@pytest.mark.slow
def test_error_rows_of_every_kind(tmp_path, tiny_overrides, clf_factory):
    inp = tmp_path / "log.jsonl"
    inp.write_bytes(b'{"query": "red dress", "id": 1}\n{"query": ""}\n{"query": "' + b"x" * 40 + b'"}\n'
                    b'{"query": "\xff"}\n{"id": 5}\n{"query": 5}\nnot json\n{"query": "red dress"}\n')
    summary, out = bulk(tmp_path, tiny_overrides, clf_factory, inp, "out.csv")
    recs = read_out(out)
    assert len(recs) == 8 and recs[0]["error"] == "" and recs[7]["error"] == ""
    assert summary["errors"] == {"empty": 1, "too_long": 1, "undecodable": 1, "missing": 1, "not_text": 1,
                                 "malformed": 1}
    assert "over max_query_tokens=16" in recs[2]["error"] and recs[0]["pred:category"] == recs[7]["pred:category"]


@pytest.mark.slow
@pytest.mark.parametrize("batch", [8, 16])
def test_batch_sizes_past_four(tmp_path, tiny_overrides, clf_factory, queries, batch):
    inp = tmp_path / "log.txt"
    write_log(inp, queries, "txt")
    s4, ref = bulk(tmp_path, tiny_overrides, clf_factory, inp, "b4.jsonl", batch_size=4)
    sb, out = bulk(tmp_path, tiny_overrides, clf_factory, inp, f"b{batch}.jsonl", batch_size=batch)
    assert (s4["batch_size"], sb["batch_size"]) == (4, batch)
    for a, b in zip(results(read_out(ref)), results(read_out(out))):
        assert a[0] == b[0] and a[2] == b[2] and a[1] == pytest.approx(b[1], abs=1e-5)


class Killed(Exception):
    pass


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", [0, 2, 5])
def test_resume_after_interruption_equals_uninterrupted(tmp_path, tiny_overrides, clf_factory, queries,
                                                        monkeypatch, kill_at):
    """Interrupted while writing part `kill_at` (a half-written .tmp left behind), then run again; cache_size
    small enough that evictions happen, so the rebuilt cache must match for the batches to match."""
    inp = tmp_path / "log.csv"
    write_log(inp, queries, "csv")
    kw = dict(chunk_rows=40, cache_size=20, all_labels=True)
    _, ref = bulk(tmp_path, tiny_overrides, clf_factory, inp, "ref.csv", **kw)
    real = Format.write_part
    calls = []

    def dying(self, path, records):
        if len(calls) == kill_at:
            path.with_name(path.name + ".tmp").write_text(self.lines(records)[:50])
            raise Killed
        calls.append(path)
        real(self, path, records)

    monkeypatch.setattr(Format, "write_part", dying)
    with pytest.raises(Killed):
        bulk(tmp_path, tiny_overrides, clf_factory, inp, "out.csv", **kw)
    monkeypatch.setattr(Format, "write_part", real)
    parts = runner.parts_dir(tmp_path / "out.csv")
    assert len(list(parts.glob("part-*.csv"))) == kill_at and list(parts.glob("*.tmp"))
    summary, out = bulk(tmp_path, tiny_overrides, clf_factory, inp, "out.csv", **kw)
    assert out.read_bytes() == ref.read_bytes()
    assert summary["resumed_rows"] == 40 * kill_at and summary["rows"] == len(queries)


@pytest.mark.slow
def test_killed_between_join_and_cleanup(tmp_path, tiny_overrides, clf_factory, queries, monkeypatch):
    inp = tmp_path / "log.txt"
    write_log(inp, queries, "txt")
    _, ref = bulk(tmp_path, tiny_overrides, clf_factory, inp, "ref.parquet", chunk_rows=50)
    monkeypatch.setattr(runner.shutil, "rmtree", lambda *a, **k: (_ for _ in ()).throw(Killed()))
    with pytest.raises(Killed):
        bulk(tmp_path, tiny_overrides, clf_factory, inp, "out.parquet", chunk_rows=50)
    monkeypatch.undo()
    summary, out = bulk(tmp_path, tiny_overrides, clf_factory, inp, "out.parquet", chunk_rows=50)
    assert read_out(out) == read_out(ref) and summary["resumed_rows"] == len(queries)


@pytest.mark.slow
def test_other_arguments_do_not_resume(tmp_path, tiny_overrides, clf_factory, queries):
    inp = tmp_path / "log.txt"
    write_log(inp, queries, "txt")
    runner.parts_dir(tmp_path / "out.jsonl").mkdir()
    (runner.parts_dir(tmp_path / "out.jsonl") / runner.MANIFEST).write_text(json.dumps({"version": 1, "chunk_rows": 7}))
    with pytest.raises(ValueError, match="interrupted run with other arguments") as e:
        bulk(tmp_path, tiny_overrides, clf_factory, inp, "out.jsonl")
    assert "delete that folder" in str(e.value)
