"""`qcls calibrate`: fits on a split, writes the YAML that `calibration=FILE` loads, prints before → after;
a sweep job with that file reports metrics with and without it."""
from __future__ import annotations

import json

import numpy as np
import pytest

from qcls.sweep import models
from qcls.fitting.calibrate import main
from qcls.heads.bounds import wilson
from qcls.heads.files import load as load_head
from qcls.eval.metrics import softmax
from qcls.sweep.sweep import main as sweep_main
from tests.eval.sweep_helpers import EVAL10, FIT10, read_jsonl, tiny, write_set


def test_calibrate_writes_a_file_that_a_sweep_job_loads(tiny_dirs, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dev = write_set(tmp_path / "dev.jsonl", FIT10)
    assert main(["--eval", str(dev), *tiny(tiny_dirs["qwen3"])]) == 0
    text = capsys.readouterr().out
    path = tmp_path / "calibration" / "tiny_default_trie.yaml"  # model, prompts group, strategy
    assert path.is_file() and "calibration=calibration/tiny_default_trie.yaml" in text
    assert "NLL before → after" in text and "category" in text and "audience" in text
    cal = load_head(path)
    assert cal.method == "temperature_bias" and cal.meta["strategy"] == "trie" and set(cal.prompts) == {
        "category", "audience"}

    assert main(["--eval", str(dev), "--method", "contextual", "--json", "--out", "ctx.yaml",
                 *tiny(tiny_dirs["qwen3"])]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["method"] == "contextual" and load_head(tmp_path / "ctx.yaml").method == "contextual"
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


# ---- learned heads ----------------------------------------------------------------------------------------
CATEGORY = ["dress", "jeans", "shirt", "trench", "skirt", "tee", "hoodie", "knit", "other", "none"]
AUDIENCE = ["boy", "girl", "man", "woman", "pregnant", "none"]
WORDS = "red slim dress boys hoodie cotton summer knit wool kids".split()


def head_set(path, n: int = 30, offset: int = 0):
    """prompts=default, every label gold at least n // 10 times."""
    rows = [(f"{WORDS[(i + offset) % len(WORDS)]} {WORDS[(3 * i + offset) % len(WORDS)]} {i + offset}",
             {"category": CATEGORY[i % 10], "audience": AUDIENCE[i % 6]}) for i in range(n)]
    return write_set(path, rows)


def test_calibrate_head_writes_a_file_that_classifies(tiny_dirs, tmp_path, capsys, monkeypatch):
    from qcls.classifier import Classifier
    from qcls.config.compose import compose
    monkeypatch.chdir(tmp_path)
    dev = head_set(tmp_path / "dev.jsonl")
    assert main(["--eval", str(dev), "--method", "head", "--layer", "1", "--read", "both", "--with-scores",
                 *tiny(tiny_dirs["qwen3"])]) == 0
    text = capsys.readouterr().out
    path = tmp_path / "calibration" / "tiny_default_head.yaml"
    assert path.is_file() and path.with_suffix(".safetensors").is_file()
    assert "calibration=calibration/tiny_default_head.yaml" in text
    assert "both @ layer 1 + raw scores" in text and "head (nested CV) [95 %]" in text and "category  30" in text
    clf = Classifier(compose([*tiny(tiny_dirs["qwen3"]), f"calibration={path}"]))
    r = clf.classify(["red dress"])[0]
    assert r.meta["calibration"] == str(path) and all(p.raw_label is not None for p in r.prompts)
    assert all(abs(sum(s.prob for s in p.labels) - 1) < 1e-6 and p.labels[0].head_score is not None
               for p in r.prompts)
    # a sweep job that scores the split the head was fitted on says its columns are not held out
    out = tmp_path / "run"
    assert sweep_main([*tiny(tiny_dirs["qwen3"]), f"eval.path={dev}", f"calibration={path}", "eval.batch1_queries=0",
                       "eval.agreement_with_exact=false", f"hydra.run.dir={out}"]) == 0
    block = json.loads((out / "result.json").read_text())["calibration"]
    assert block["method"] == "head" and "fitted on this split" in block["warning"]
    assert "## Warnings" in (out / "summary.md").read_text()
    models.release()


def test_calibrate_head_chooses_the_depth_for_the_prompt_set(tiny_dirs, tmp_path, capsys):
    """--layer auto on the 2-layer tiny model: candidates after layer 1 (cost 0.5) and final (1.0). The file
    stores per candidate exit each prompt's CV accuracy, log-loss and SE, loads as before, and the rules and
    --max-layer give the exits their definitions say."""
    dev = head_set(tmp_path / "dev.jsonl")
    got = {}
    for name, extra in (("one-se", []), ("best", ["--layer-rule", "best"]), ("max1", ["--max-layer", "1"])):
        out = tmp_path / f"{name}.yaml"
        assert main(["--eval", str(dev), "--method", "head", "--read", "position", "--json", "--out", str(out), *extra,
                     *tiny(tiny_dirs["qwen3"])]) == 0
        res = json.loads(capsys.readouterr().out)
        head = load_head(out)  # a valid head file, loaded as before
        got[name] = head.meta["depth"]
        assert res["depth"] == got[name] and set(head.prompts) == {"category", "audience"}
    d = got["one-se"]
    assert d["rule"] == "one-se" and d["num_layers"] == 2
    assert [(r["exit_layer"], r["layers_run"], r["forward_cost"]) for r in d["candidates"]] == [(1, 1, 0.5),
                                                                                               ("final", 2, 1.0)]
    for row in d["candidates"]:
        for p in ("category", "audience"):
            v = row["prompts"][p]
            assert set(v) == {"read", "cv_accuracy", "cv_log_loss", "cv_log_loss_se", "within_one_se"}
            assert 0 <= v["cv_accuracy"] <= 1 and v["cv_log_loss"] > 0 and v["cv_log_loss_se"] >= 0
    # the stored table decides as the rule says: the first exit where every prompt is within one SE
    assert d["exit_layer"] == next(r["exit_layer"] for r in d["candidates"] if r["all_within_one_se"])
    # best: each prompt's lowest CV log-loss over both reads; the exit is the deepest of them
    final = d["candidates"][-1]["prompts"]
    assert got["best"]["exit_layer"] == ("final" if any(v["read"] == "position@final" for v in final.values())
                                         else 1) == d["most_accurate"]["exit_layer"]
    m = got["max1"]
    assert m["max_layer"] == 1 and m["exit_layer"] == 1 and [r["exit_layer"] for r in m["candidates"]] == [1]
    assert main(["--eval", str(dev), "--method", "head", "--layer", "final", "--max-layer", "1",
                 *tiny(tiny_dirs["qwen3"])]) == 2
    assert "max layer 1: the reads asked for (layer final) all lie deeper" in capsys.readouterr().err
    models.release()


def test_calibrate_head_prints_the_depth_table(tiny_dirs, tmp_path, capsys):
    dev = head_set(tmp_path / "dev.jsonl")
    assert main(["--eval", str(dev), "--method", "head", "--read", "position", "--out", str(tmp_path / "h.yaml"),
                 *tiny(tiny_dirs["qwen3"])]) == 0
    text = capsys.readouterr().out
    assert "depth (rule one-se): exit after" in text and "of 2 layers" in text
    assert "category: read, acc, log-loss ± SE" in text and "1 (1/2)" in text and "final (2/2)" in text
    assert sum(line.lstrip().startswith("→") for line in text.splitlines()) == 1
    models.release()


def test_calibrate_head_refuses_a_thin_split_before_loading(tmp_path, capsys):
    thin = write_set(tmp_path / "thin.jsonl", FIT10)  # category 'none' never occurs there
    assert main(["--eval", str(thin), "--method", "head", "prompts=default"]) == 2
    err = capsys.readouterr().err
    assert "prompt 'category': labels ['none'] never occur" in err and "label at least 3 queries" in err


def test_sweep_fits_a_head_per_job_with_a_learning_curve(tiny_dirs, tmp_path):
    """eval.fit_method=head: the job fits on fit_on, reports the eval split with and without the head and the
    learning curve, saves head.yaml; its head probabilities equal what the saved file gives through the
    engine (the job computes them from the states in numpy)."""
    from qcls.classifier import Classifier
    from qcls.config.compose import compose
    dev, ev = head_set(tmp_path / "dev.jsonl"), head_set(tmp_path / "ev.jsonl", 12, offset=40)
    out = tmp_path / "sweep"
    assert sweep_main(["-m", *tiny(tiny_dirs["qwen3"]), f"eval.path={ev}", f"eval.fit_on={dev}",
                       "eval.fit_method=head", "eval.head.layer=1,final", "eval.head.curve_sizes=[10,20]",
                       "eval.head.curve_draws=2", "eval.batch1_queries=0", "eval.agreement_with_exact=false",
                       f"hydra.sweep.dir={out}"]) == 0
    for job in ("0", "1"):
        r = json.loads((out / job / "result.json").read_text())
        assert r["status"] == "ok", r.get("reason")
        block = r["calibration"]
        assert block["method"] == "head" and block["n_fit"] == {"category": 30, "audience": 30}
        assert block["per_prompt"]["category"]["raw"]["accuracy"] == r["per_prompt"]["category"]["accuracy"]
        curve = block["learning_curve"]
        assert curve["sizes"] == ["10", "20", "all"] and len(curve["per_prompt"]["audience"]["10"]) == 2
        assert block["heads"]["audience"]["read"]["layer"] == (1 if job == "0" else "final")
        # the forward the head needs: 1 of the tiny model's 2 layers, or all of them for the final read
        assert r["forward"]["forward_cost"] == (0.5 if job == "0" else 1.0) and r["forward"]["num_layers"] == 2
        assert block["depth"]["exit_layer"] == (1 if job == "0" else "final")
        head_file = out / job / "head.yaml"
        clf = Classifier(compose([*tiny(tiny_dirs["qwen3"]), f"calibration={head_file}"]))
        rows = read_jsonl(out / job / "predictions.jsonl")
        got = clf.classify([x["query"] for x in rows])
        for x, g in zip(rows, got):
            for p in g.prompts:
                want = x["prompts"][p.prompt]["calibrated_probs"]
                assert max(abs(s.prob - want[s.label]) for s in p.labels) < 1e-4
    summary = (out / "summary.md").read_text()
    assert "## Learning curve" in summary and (out / "learning_curve.png").is_file()
    # each point with its 95 % Wilson interval over the 2 prompts × 12 scored queries
    curve_md = summary.split("## Learning curve")[1].split("\n## ")[0]
    acc = curve["mean_accuracy"]["all"]
    lo, hi = wilson(round(acc * 24), 24)
    assert curve["n_eval"] == {"category": 12, "audience": 12} and "| 24 |" in curve_md
    assert f"{acc:.3f} [{lo:.3f}, {hi:.3f}]" in curve_md
    # the head's layer as a sweep axis: per prompt accuracy against forward cost, beside TF-IDF
    cost = summary.split("## Accuracy against forward cost")[1].split("\n## ")[0]
    assert "### category" in cost and "### audience" in cost and "TF-IDF + LR (no LLM)" in cost
    assert "@1 | 1/2 | 0.500 |" in cost and "| position@final | 2/2 | 1.000 |" in cost
    assert (out / "accuracy_cost.png").is_file() and "forward cost" in summary.split("## Accuracy per prompt")[0]
    models.release()
