"""Input formats → rows: every format's rows and pass-through values, each kind of bad row as an error row,
and files that are not what their extension says refused at start with the file and the line."""
from __future__ import annotations

import json

import pytest

from qcls.query_files import InputError, Reader


def rows(path, column=None):
    return list(Reader(path, column).rows())


def test_txt_rows_line_numbers_and_bad_bytes(tmp_path):
    p = tmp_path / "q.txt"
    p.write_bytes(b"\xef\xbb\xbfred dress\r\n\nbad \xff byte\n\xe5\xa5\xb3\xe8\xa3\x85\nlast")
    got = rows(p)
    assert [(r.line, r.query, r.kind) for r in got] == [
        (1, "red dress", None), (2, "", None), (3, None, "undecodable"), (4, "女装", None), (5, "last", None)]
    assert got[2].values == {"query": "bad \ufffd byte"} and "line 3" in got[2].error


def test_csv_columns_quotes_and_bad_records(tmp_path):
    p = tmp_path / "q.csv"
    p.write_bytes(b'id,query,n\n1,"red, dress",3\n2,"two\nlines",4\n3\n4,a,5,extra\n5,b\xff,6\n\n6,tee,7\n')
    got = rows(p)
    assert [(r.line, r.values.get("id"), r.query, r.kind) for r in got] == [
        (2, "1", "red, dress", None), (3, "2", "two\nlines", None), (5, "3", None, "missing"),
        (6, "4", None, "malformed"), (7, "5", None, "undecodable"), (8, None, None, "missing"), (9, "6", "tee", None)]
    assert got[0].values == {"id": "1", "query": "red, dress", "n": "3"}
    assert got[4].values["query"] == "b\ufffd"


def test_tsv_and_named_column(tmp_path):
    p = tmp_path / "q.tsv"
    p.write_text("q\tid\nred dress\t7\n", encoding="utf-8")
    [r] = rows(p, "q")
    assert r.query == "red dress" and r.values == {"q": "red dress", "id": "7"}


def test_jsonl_bad_lines_are_error_rows(tmp_path):
    p = tmp_path / "q.jsonl"
    p.write_bytes(b'{"query": "tee", "id": 1, "tags": ["a"]}\n{not json\n[1]\n{"id": 2}\n{"query": 5}\n'
                  b'{"query": "\xff"}\n{"query": null}\n')
    got = rows(p)
    assert [r.kind for r in got] == [None, "malformed", "malformed", "missing", "not_text", "undecodable", "missing"]
    assert got[0].values == {"query": "tee", "id": 1, "tags": ["a"]} and got[0].query == "tee"


def test_parquet_rows(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    p = tmp_path / "q.parquet"
    pq.write_table(pa.table({"query": ["tee", None, "jeans"], "n": [1, 2, 3]}), p)
    r = Reader(p)
    got = list(r.rows())
    assert r.total_rows == 3 and [(x.line, x.query, x.kind) for x in got] == [(1, "tee", None), (2, None, "missing"),
                                                                             (3, "jeans", None)]
    assert got[2].values == {"query": "jeans", "n": 3}


@pytest.mark.parametrize("name,data,line,words", [
    ("q.csv", b"id,text\n1,a\n", 1, "no column 'query'"),
    ("q.csv", b'{"query": "a"}\n', 1, "looks like JSON"),
    ("q.tsv", b"PAR1xxxx", 1, "Parquet file"),
    ("q.jsonl", b"query,id\n", 1, "not a JSON object"),
    ("q.jsonl", b'["a"]\n', 1, "not an object"),
    ("q.jsonl", b'{"text": "a"}\n', 1, "no key 'query'"),
    ("q.parquet", b"query\nred\n", 1, "not a Parquet file"),
    ("q.txt", b"a\nb\nc\x00d\n", 3, "NUL bytes"),
])
def test_file_not_what_its_name_says_is_refused(tmp_path, name, data, line, words):
    p = tmp_path / name
    p.write_bytes(data)
    with pytest.raises(InputError) as e:
        Reader(p)
    assert f"{p} line {line}" in str(e.value) and words in str(e.value)


def test_unknown_extension_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="unknown extension"):
        Reader(tmp_path / "q.xlsx")
    with pytest.raises(ValueError, match="no such file"):
        Reader(tmp_path / "q.txt")


def test_column_flag_finds_the_key(tmp_path):
    p = tmp_path / "q.jsonl"
    p.write_text(json.dumps({"text": "tee"}) + "\n", encoding="utf-8")
    assert rows(p, "text")[0].query == "tee"
