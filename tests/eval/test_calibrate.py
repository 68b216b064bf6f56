"""`qcls calibrate`: fits on a split, writes the YAML that `calibration=FILE` loads, prints before → after;
a sweep job with that file reports metrics with and without it."""
from __future__ import annotations

import json

import numpy as np
import pytest

from qcls.eval import models
from qcls.eval.calibrate import main
from qcls.scoring.calibration import Calibration
from qcls.eval.metrics import softmax
from qcls.eval.sweep import main as sweep_main
from tests.eval.sweep_helpers import EVAL10, FIT10, tiny, write_set


def test_calibrate_writes_a_file_that_a_sweep_job_loads(tiny_dirs, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dev = write_set(tmp_path / "dev.jsonl", FIT10)
    assert main(["--eval", str(dev), *tiny(tiny_dirs["qwen3"])]) == 0
    text = capsys.readouterr().out
    path = tmp_path / "calibration" / "tiny_default_trie.yaml"  # model, prompts group, strategy
    assert path.is_file() and "calibration=calibration/tiny_default_trie.yaml" in text
    assert "NLL before → after" in text and "category" in text and "audience" in text
    cal = Calibration.load(path)
    assert cal.method == "temperature_bias" and cal.meta["strategy"] == "trie" and set(cal.prompts) == {
        "category", "audience"}

    assert main(["--eval", str(dev), "--method", "contextual", "--json", "--out", "ctx.yaml",
                 *tiny(tiny_dirs["qwen3"])]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["method"] == "contextual" and Calibration.load(tmp_path / "ctx.yaml").method == "contextual"
    assert res["override"] == "calibration=ctx.yaml" and res["n_queries"] == 10
    assert res["per_prompt"]["audience"]["raw"]["n"] == 10 and res["per_prompt"]["audience"]["calibrated"]["nll"] > 0

    ev = write_set(tmp_path / "eval.jsonl", EVAL10)
    out = tmp_path / "run"
    assert sweep_main([*tiny(tiny_dirs["qwen3"]), f"eval.path={ev}", f"calibration={path}", "eval.batch1_queries=0",
                       "eval.agreement_with_exact=false", f"hydra.run.dir={out}"]) == 0
    r = json.loads((out / "result.json").read_text())
    assert r["status"] == "ok", r["reason"]
    block = r["calibration"]
    assert block["source"] == f"file {path}" and block["method"] == "temperature_bias"
    raw = block["per_prompt"]["category"]["raw"]
    assert raw["accuracy"] == r["per_prompt"]["category"]["accuracy"]  # raw metrics use the raw scores
    # the engine's calibrated scores are the file's map of the raw ones
    pred = json.loads((out / "predictions.jsonl").read_text().splitlines()[0])["prompts"]["category"]
    want = cal.apply("category", list(pred["scores"].values()))
    assert list(pred["calibrated_probs"].values()) == pytest.approx(list(softmax(np.array([want]))[0]), abs=1e-5)
    models.release()


def test_calibrate_refuses_bad_input_before_loading(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query": "a", "labels": {"category": "sweater"}}\n')
    assert main(["--eval", str(bad)]) == 2
    assert f"{bad}:1:" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["not-an-override"])
