"""Result columns and output files: a part read back gives the records' results exactly (resume rebuilds the
cache from them), parts join into one file per format, and a clash with an input column is refused."""
from __future__ import annotations

import csv
import io
import json

import pytest

from qcls.bulk.outputs import Columns, Format, output_format

PROMPTS = [("category", ["dress", "tee"]), ("audience", ["boy", "girl", "none"])]
# audience abstained (its most probable label fell short of its threshold): no label, marked
RESULT = (("tee", None), (0.1 + 0.2, 1 / 2), ((0.7, 0.30000000000000004), (1 / 3, 0.5, 1 / 6)), (False, True))
NO_FULL = RESULT[:2] + (None,) + RESULT[3:]


def records(cols: Columns) -> list[dict]:
    r = RESULT if cols.all_labels else NO_FULL
    return [cols.record({"query": "red, \"dress\"\n", "id": 1, "tags": ["a"]}, r, None),
            cols.record({"query": "", "id": 2, "tags": None}, None, "empty query: give at least one character")]


@pytest.mark.parametrize("ext", [".jsonl", ".csv", ".tsv", ".parquet"])
@pytest.mark.parametrize("all_labels", [False, True])
def test_part_round_trip_and_join(tmp_path, ext, all_labels):
    if ext == ".parquet":
        pytest.importorskip("pyarrow")
    cols = Columns.build(["query", "id", "tags"], PROMPTS, all_labels)
    fmt = Format(output_format("x" + ext), cols)
    recs = records(cols)
    parts = [tmp_path / f"part-{i}{ext}" for i in range(2)]
    for p in parts:
        fmt.write_part(p, recs)
    back = fmt.read_part(parts[0])
    assert [cols.parse(r) for r in back] == [cols.parse(r) for r in recs] == [
        RESULT if all_labels else NO_FULL, None]
    assert back[0]["query"] == "red, \"dress\"\n" and back[1]["error"] == recs[1]["error"]
    assert back[0]["pred:audience"] in (None, "") and back[0]["pred:audience:abstained"] in (True, "true")
    assert back[0]["pred:category:abstained"] in (False, "false")
    out = tmp_path / ("out" + ext)
    fmt.join(parts, out)
    assert not list(tmp_path.glob("*.tmp"))
    if ext == ".jsonl":
        lines = out.read_text(encoding="utf-8").splitlines()
        assert len(lines) == 4 and json.loads(lines[0])["tags"] == ["a"]  # JSONL keeps the input's values
    elif ext == ".parquet":
        import pyarrow.parquet as pq
        t = pq.read_table(out)
        assert t.num_rows == 4 and t.column_names == cols.names and t.column("tags").to_pylist()[0] == '["a"]'
        assert t.column("pred:audience:abstained").to_pylist() == [True, None] * 2
        assert t.column("pred:audience").to_pylist() == [None, None] * 2
    else:
        text = out.read_text(encoding="utf-8")
        assert text.startswith(("\t" if ext == ".tsv" else ",").join(cols.names) + "\n")
        row = next(csv.DictReader(io.StringIO(text), delimiter="\t" if ext == ".tsv" else ","))
        assert (row["pred:audience"], row["pred:audience:abstained"], row["pred:category:abstained"]) == \
            ("", "true", "false")


def test_result_columns_and_clash():
    cols = Columns.build(["query"], PROMPTS, True)
    assert cols.names == ["query", "pred:category", "pred:category:prob", "pred:category:abstained",
                          "prob:category:dress", "prob:category:tee", "pred:audience", "pred:audience:prob",
                          "pred:audience:abstained", "prob:audience:boy", "prob:audience:girl", "prob:audience:none",
                          "error"]
    with pytest.raises(ValueError, match=r"\['pred:category:prob'\] have the names of result columns"):
        Columns.build(["query", "pred:category:prob"], PROMPTS, False)


def test_unknown_output_extension():
    with pytest.raises(ValueError, match="unknown extension '.xlsx'"):
        output_format("out.xlsx")
