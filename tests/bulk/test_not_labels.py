"""A `qcls bulk` output holds the model's answers, never gold labels: given to `qcls calibrate --eval` it is
refused before any model loads, with a message saying what the file is (a head fitted on the model's own answers
learns nothing)."""
from __future__ import annotations

import pytest

from qcls.bulk.outputs import Columns, Format, output_format
from qcls.fitting.calibrate import main as calibrate_main

PROMPTS = [("category", ["dress", "jeans", "shirt"]), ("audience", ["boy", "girl", "man"])]


@pytest.mark.parametrize("ext", [".csv", ".jsonl"])
def test_a_bulk_output_is_refused_as_labels(tmp_path, capsys, ext):
    cols = Columns.build(["query"], PROMPTS, all_labels=False)
    fmt = Format(output_format("out" + ext), cols)
    answers = {"maxi dress": ("dress", "girl"), "slim jeans men": ("jeans", "man"), "boys shirt": ("shirt", "boy")}
    records = [cols.record({"query": q}, ((cat, aud), (0.9, 0.8), None, (False, False)), None)
               for q, (cat, aud) in answers.items()]
    part = tmp_path / ("part" + ext)
    fmt.write_part(part, records)
    out = tmp_path / ("bulk_out" + ext)  # (a name that does not say it)
    fmt.join([part], out)

    assert calibrate_main(["--eval", str(out), "--out", str(tmp_path / "head.yaml")]) == 2
    err = capsys.readouterr().err
    assert str(out) in err and "prediction" in err.replace(str(out), "").lower()
    assert not (tmp_path / "head.yaml").exists()
