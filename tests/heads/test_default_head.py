"""The model's default head (calibration=model) serves only the prompts it was fitted for (name, template,
labels); every other prompt keeps the LLM's own label scores, and start-up, `qcls check`, results' `meta` and
sweep results say which. A file the user names is still refused when it does not fit."""
from __future__ import annotations

import json

import numpy as np
import pytest
from transformers import AutoModelForCausalLM

from qcls import progress
from qcls.classifier import Classifier
from qcls.cli import main
from qcls.heads import files
from qcls.heads import weights_fingerprint as fp
from qcls.heads.files import template_sha256
from qcls.heads.head import Head, PromptHead, Read
from qcls.heads.startup import OTHER_LABELS, choose, lost_head
from tests.conftest import prompt, tiny_cfg

AUD = prompt("audience", ["man", "woman", "none"])
CAT = prompt("category", ["dress", "jeans", "other"], system="Category?")
COLOR = prompt("color", ["red", "blue"], system="Color?")  # never fitted
AUD_OTHER_TEMPLATE = prompt("audience", ["man", "woman", "none"], system="Who is it for?")
CAT_OTHER_LABELS = prompt("category", ["dress", "jeans"], system="Category?")
QUERIES = ["red summer dress", "mens slim jeans", "blue tee"]


@pytest.fixture(scope="module")
def head_file(tiny_dirs, tmp_path_factory):
    """A learned head of the tiny Qwen3 for `audience` and `category` (random weights: the head's
    probabilities differ visibly from the raw scores' softmax)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_dirs["qwen3"])
    hidden, rng = model.config.hidden_size, np.random.default_rng(0)
    heads = {}
    for spec in (AUD, CAT):
        n = len(spec["labels"])
        heads[spec["name"]] = PromptHead(list(spec["labels"]), rng.normal(size=n), None,
                                         rng.normal(size=(n, hidden)) * 0.5, Read("final", "position"),
                                         {"template_sha256": template_sha256(spec["template"], spec["label_prefix"])})
    meta = {"model": "tiny", "hidden_size": hidden, "num_layers": model.config.num_hidden_layers,
            "fingerprint": {"config": fp.config_fingerprint(model.config), "weights": fp.weights_fingerprint(model)},
            "config": fp.config_facts(model.config)}
    path = tmp_path_factory.mktemp("default_head") / "tiny_head.yaml"
    files.save(Head(heads, "head", meta), path)
    return path


def cfg(tiny_dirs, head_file, prompts, calibration="model", **extra):
    return tiny_cfg(tiny_dirs["qwen3"], prompts, calibration=calibration,
                    model={"name": "tiny", "source": "local", "path": tiny_dirs["qwen3"],
                           "head": None if head_file is None else str(head_file)},
                    **extra)


@pytest.mark.parametrize("prompts,with_head,own", [
    ([AUD, CAT], ["audience", "category"], {}),  # (a) the prompts it was fitted for
    ([COLOR, AUD_OTHER_TEMPLATE, CAT_OTHER_LABELS], [],  # (b) none of them
     {"color": "no head in the file", "audience": "its head was fitted under another template",
      "category": "its head was fitted for another label set"}),
    ([COLOR, AUD, CAT_OTHER_LABELS], ["audience"],  # (c) a mix
     {"color": "no head in the file", "category": "its head was fitted for another label set"}),
])
def test_choice_per_prompt(tiny_dirs, head_file, prompts, with_head, own):
    c = choose(cfg(tiny_dirs, head_file, prompts))
    assert c.default and c.with_head() == with_head and c.own == own
    assert (c.head is None) == (not with_head) and (c.path is None) == (not with_head)
    line = c.line()
    assert line.startswith("answers per prompt: ") and line.endswith(f"; the model's default head {head_file}")
    assert all(f"{name}: head" in line for name in with_head)
    assert all(f"{name}: LLM scores ({why})" in line for name, why in own.items())
    # a prompt whose head in the file no longer fits says so beside its answers, with the way back
    assert c.meta()["lost"] == {n: lost_head(why) for n, why in own.items() if why != "no head in the file"}
    assert all("refit with qcls calibrate --method head" in note for note in c.meta()["lost"].values())


def test_mix_uses_the_head_where_fitted_and_own_scores_elsewhere(tiny_dirs, head_file, capsys):
    """Per prompt: the head's probabilities where it was fitted, the raw scores' softmax (and no raw_label)
    elsewhere; the raw scores of every prompt equal a run without any head. Fast and reference engines agree."""
    prompts = [COLOR, AUD, CAT_OTHER_LABELS]
    progress.set_quiet(False)
    try:
        fast = Classifier(cfg(tiny_dirs, head_file, prompts))
    finally:
        progress.set_quiet(True)
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if "default head" in x]
    assert len(lines) == 1 and "audience: head" in lines[0] and "color: LLM scores (no head in the file)" in lines[0]
    plain = Classifier(cfg(tiny_dirs, head_file, prompts, calibration=None))
    ref = Classifier(cfg(tiny_dirs, head_file, prompts, engine={"kind": "reference"}))
    head = files.load(head_file).prompts["audience"]
    for g, b, r in zip(fast.classify(QUERIES), plain.classify(QUERIES), ref.classify(QUERIES)):
        assert g.meta["heads"] == {"file": str(head_file), "default": True, "with_head": ["audience"],
                                   "own_scores": {"color": "no head in the file", "category": OTHER_LABELS},
                                   "lost": {"category": lost_head(OTHER_LABELS)}}
        assert g.meta["calibration"] == str(head_file)
        for gp, bp, rp in zip(g.prompts, b.prompts, r.prompts):
            assert [x.score for x in gp.labels] == pytest.approx([x.score for x in bp.labels], abs=1e-5)
            assert [x.prob for x in gp.labels] == pytest.approx([x.prob for x in rp.labels], abs=1e-4)
            if gp.prompt == "audience":
                assert gp.raw_label == bp.label and gp.labels[0].head_score is not None
                probs = np.array([x.prob for x in gp.labels])
                assert np.abs(probs - np.array([x.prob for x in bp.labels])).max() > 1e-3  # the head moved them
                assert head.labels == [x.label for x in gp.labels]
            else:
                assert gp.raw_label is None and gp.labels[0].head_score is None
                assert (gp.label, [x.prob for x in gp.labels]) == (bp.label, pytest.approx([x.prob for x in bp.labels],
                                                                                           abs=1e-5))
    assert fast.metadata()["heads"]["with_head"] == ["audience"]


def test_no_prompt_fitted_builds_no_head(tiny_dirs, head_file):
    clf = Classifier(cfg(tiny_dirs, head_file, [COLOR]))
    assert clf.head is None and clf.head_path is None
    r = clf.classify(["red dress"])[0]
    assert r.meta["calibration"] is None and r.meta["heads"]["own_scores"] == {"color": "no head in the file"}
    assert r.prompts[0].raw_label is None


def test_default_head_on_other_weights_is_not_used(tiny_dirs, head_file, tmp_path):
    """The model's default head fitted on other weights: no prompt uses it (a note says why); the same file
    named by the user is refused."""
    bad = files.load(head_file)
    bad.meta["fingerprint"]["weights"] = "feedfacefeedface"
    files.save(bad, tmp_path / "other.yaml")
    clf = Classifier(cfg(tiny_dirs, tmp_path / "other.yaml", [AUD]))
    assert clf.head is None and clf.heads.own == {"audience": "the model's default head does not fit these weights"}
    assert any("fitted on other weights" in n for n in clf.notes)
    with pytest.raises(files.CalibrationError, match="fitted on other weights"):
        Classifier(cfg(tiny_dirs, tmp_path / "other.yaml", [AUD, CAT], calibration=str(tmp_path / "other.yaml")))


def test_explicit_file_with_foreign_prompts_exits_2(tiny_dirs, head_file, capfd):
    """The same file named with calibration=FILE under a prompt set it was not fitted for is refused (exit 2,
    before any weight loads), while calibration=model (the default) starts and answers (its per-prompt
    choice: test_choice_per_prompt)."""
    base = ["prompts=default", "model.source=local", f"model.path={tiny_dirs['qwen3']}", "model.name=tiny",
            "engine.query_buckets=[8,16]", "max_query_tokens=16", "engine.warmup_requests=1"]
    assert main(["classify", *base, f"calibration={head_file}", "red dress"]) == 2
    err = capfd.readouterr().err
    assert "qcls: error:" in err and str(head_file) in err and "Traceback" not in err
    assert "fitted under another template" in err
    assert main(["classify", *base, f"model.head={head_file}", "red dress"]) == 0  # calibration=model


def test_a_missing_default_head_file_names_model_head(tiny_dirs, tmp_path):
    with pytest.raises(files.CalibrationError, match=r"model 'tiny' names its default head model.head='.*gone.yaml' "
                                                     r"\(calibration=model\), which cannot be used: .*no such file"):
        choose(cfg(tiny_dirs, tmp_path / "gone.yaml", [AUD]))


def test_a_sweep_job_scores_the_mix(tiny_dirs, tmp_path):
    """A sweep job under calibration=model whose head fits `category` only: the calibrated columns are the
    head's for category and the raw scores' for audience; result.json says which."""
    from qcls.config.compose import compose
    from qcls.sweep import models
    from qcls.sweep.sweep import main as sweep_main
    from tests.eval.sweep_helpers import EVAL10, FIT10, tiny, write_set
    spec = next(p for p in compose(tiny(tiny_dirs["qwen3"])).prompts if p.name == "category")
    model = AutoModelForCausalLM.from_pretrained(tiny_dirs["qwen3"])
    n, hidden = len(spec.labels), model.config.hidden_size
    ph = PromptHead(list(spec.labels), np.linspace(-1, 1, n), None,
                    np.random.default_rng(1).normal(size=(n, hidden)), Read("final", "position"),
                    {"template_sha256": template_sha256(spec.template, spec.label_prefix)})
    fit = write_set(tmp_path / "fit.jsonl", FIT10)
    meta = {"model": "tiny", "fingerprint": {"config": fp.config_fingerprint(model.config),
                                             "weights": fp.weights_fingerprint(model)}, "fitted_on": str(fit)}
    files.save(Head({"category": ph}, "head", meta), tmp_path / "h.yaml")
    ev, out = write_set(tmp_path / "ev.jsonl", EVAL10), tmp_path / "run"
    overrides = [x for x in tiny(tiny_dirs["qwen3"]) if x != "model.head=null"]
    assert sweep_main([*overrides, f"model.head={tmp_path / 'h.yaml'}", f"eval.path={ev}", "eval.batch1_queries=0",
                       "eval.agreement_with_exact=false", f"hydra.run.dir={out}"]) == 0
    models.release()
    r = json.loads((out / "result.json").read_text())
    assert r["status"] == "ok", r.get("reason")
    assert r["heads"]["with_head"] == ["category"] and r["heads"]["own_scores"] == {"audience": "no head in the file"}
    assert r["config"]["calibration_is_default"] and r["calibration"]["heads"] == r["heads"]
    cal = r["calibration"]["per_prompt"]
    assert cal["audience"]["calibrated"] == cal["audience"]["raw"]
    assert cal["category"]["calibrated"]["nll"] != cal["category"]["raw"]["nll"]
    # the baselines are fitted on the split the head file records (meta.fitted_on), scored on eval.path
    assert r["baseline"]["source"] == f"fitted on {fit}, scored on {ev}"


def test_no_head_file_says_why_per_prompt(tiny_dirs, head_file):
    c = choose(cfg(tiny_dirs, head_file, [AUD, COLOR], calibration=None))
    assert c.head is None and c.own == {"audience": "calibration=null", "color": "calibration=null"}
    assert c.line() == "answers per prompt: audience: LLM scores, color: LLM scores (no head: calibration=null)"
    assert c.meta()["lost"] == {}
    c = choose(cfg(tiny_dirs, None, [AUD]))
    assert c.default and c.own == {"audience": "the model has no default head (model.head=null)"}
    assert c.line() == "answers per prompt: audience: LLM scores (no head: the model has no default head (model.head=null))"
