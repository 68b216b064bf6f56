"""Start-up checks of `calibration=FILE` (qcls/heads/startup.py): the file against the config before anything
loads, a learned head against the model's config and weights; every refusal names what differs."""
from __future__ import annotations

import numpy as np
import pytest

from qcls.config.compose import validate
from qcls.heads import files
from qcls.heads import weights_fingerprint as fp
from qcls.heads.files import CalibrationError, template_sha256
from qcls.heads.head import Head, PromptHead, Read
from qcls.heads.startup import check_model_config, check_model_weights, head_for
from tests.conftest import prompt

PROMPTS = [prompt("a", ["man", "woman", "none"]), prompt("b", ["dress", "jeans"])]


def cfg_with(path, strategy="trie", prompts=None, **extra):
    return validate({"model": {"name": "m", "source": "local", "path": "/nonexistent"}, "prompts": prompts or PROMPTS,
                     "scoring": {"name": strategy}, "calibration": str(path), **extra})


def write(tmp_path, prompts: dict[str, dict[str, float]], strategy="trie", name="cal.yaml"):
    head = Head({p: PromptHead.temperature_bias(list(b), 1.5, list(b.values())) for p, b in prompts.items()},
                "temperature_bias", {"strategy": strategy, "model": "m"})
    files.save(head, tmp_path / name)
    return tmp_path / name


def test_startup_reorders_to_config_labels_and_notes_missing_prompts(tmp_path):
    path = write(tmp_path, {"a": {"none": 0.3, "man": 0.1, "woman": -0.4}})
    head, where, notes = head_for(cfg_with(path))
    assert where == str(path.resolve())
    ph = head.prompts["a"]
    assert ph.labels == ["man", "woman", "none"] and ph.apply([0, 0, 0]) == pytest.approx([0.1 / 1.5, -0.4 / 1.5,
                                                                                             0.3 / 1.5])
    assert head.apply("b", [1.0, 2.0]) == [1.0, 2.0]
    assert any("no entry for prompts ['b']" in n for n in notes)


@pytest.mark.parametrize("case,match", [
    ("strategy", r"fitted under scoring=exact, but this config scores with scoring=trie.*add the override "
                 r"scoring=exact"),
    ("extra prompt", r"has heads for prompts \['zz'\] that the config lacks"),
    ("labels", r"prompt 'a' has labels \['man', 'woman', 'boy'\].*missing from the file: \['none'\], "
               r"not in the config: \['boy'\]"),
])
def test_startup_refuses_mismatched_files(tmp_path, case, match):
    prompts = {"a": {"man": 0.0, "woman": 0.1, "none": -0.1}}
    if case == "extra prompt":
        prompts["zz"] = {"x": 0.0, "y": 0.0}
    if case == "labels":
        prompts["a"] = {"man": 0.0, "woman": 0.1, "boy": -0.1}
    path = write(tmp_path, prompts, strategy="exact" if case == "strategy" else "trie")
    with pytest.raises(CalibrationError, match=match) as e:
        head_for(cfg_with(path))
    assert str(path.resolve()) in str(e.value)


def test_startup_path_resolution(tmp_path, monkeypatch):
    """Relative paths: the current directory first, then the package (qcls/config/paths.py PACKAGE_DIR)."""
    write(tmp_path, {"a": {"man": 0.0, "woman": 0.0, "none": 0.0}})
    monkeypatch.chdir(tmp_path)
    assert head_for(cfg_with("cal.yaml"))[1] == str((tmp_path / "cal.yaml").resolve())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr("qcls.config.paths.PACKAGE_DIR", tmp_path)
    assert head_for(cfg_with("cal.yaml"))[1] == str((tmp_path / "cal.yaml").resolve())
    assert head_for(cfg_with(tmp_path / "cal.yaml"))[0] is not None  # absolute
    with pytest.raises(CalibrationError, match=r"'nope.yaml': no such file \(looked at .*elsewhere/nope.yaml, "
                                               r".*nope.yaml\)") as e:
        head_for(cfg_with("nope.yaml"))
    assert "qcls calibrate" in str(e.value) and "calibration=null" in str(e.value)


def test_classifier_refuses_before_weights_load(tmp_path, monkeypatch):
    from qcls.backends import sources
    from qcls.classifier import Classifier

    def nothing(*a, **k):
        raise AssertionError("the tokenizer or weights were loaded before the calibration was checked")
    monkeypatch.setattr(sources, "load_tokenizer", nothing)
    path = write(tmp_path, {"zz": {"x": 0.0, "y": 0.0}})
    with pytest.raises(CalibrationError, match="has heads for prompts"):
        Classifier(cfg_with(path))


# ---- learned heads: template, model config, weights -----------------------------------------------------
@pytest.fixture(scope="module")
def tiny_model(tiny_dirs):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(tiny_dirs["qwen3"])


def learned_head(model, *, layer=1, kind="both", hidden=None, template=None, strategy=None, weights=None,
                 scores=False):
    cfg = model.config
    hidden = hidden or cfg.hidden_size
    read = Read(layer, kind)
    spec = PROMPTS[0]
    ph = PromptHead(["man", "woman", "none"], np.zeros(3), np.eye(3) if scores else None,
                    np.zeros((3, hidden * len(read.taps))), read,
                    {"template_sha256": template or template_sha256(spec["template"], spec["label_prefix"])})
    meta = {"model": "m", "hidden_size": hidden, "num_layers": cfg.num_hidden_layers,
            "fingerprint": {"config": fp.config_fingerprint(cfg), "weights": weights or fp.weights_fingerprint(model)},
            "config": fp.config_facts(cfg)}
    if strategy:
        meta["strategy"] = strategy
    return Head({"a": ph}, "head", meta)


def test_a_head_on_hidden_states_needs_no_strategy_but_one_on_scores_does(tmp_path, tiny_model):
    files.save(learned_head(tiny_model), tmp_path / "h.yaml")
    for strategy in ("trie", "exact", "first_token"):  # the root state is the same under every strategy
        assert head_for(cfg_with(tmp_path / "h.yaml", strategy,
                                 [prompt("a", ["man", "woman", "none"]), prompt("b", ["dress", "jeans"])]))[0]
    files.save(learned_head(tiny_model, scores=True, strategy="exact"), tmp_path / "s.yaml")
    with pytest.raises(CalibrationError, match="fitted under scoring=exact"):
        head_for(cfg_with(tmp_path / "s.yaml", "trie"))


def test_a_head_for_another_template_is_refused(tmp_path, tiny_model):
    files.save(learned_head(tiny_model, template="0123456789abcdef"), tmp_path / "h.yaml")
    with pytest.raises(CalibrationError, match=r"head\(s\) of prompt 'a' were fitted under another template or "
                                               r"label_prefix .*the file's: 0123456789abcdef.*--append"):
        head_for(cfg_with(tmp_path / "h.yaml"))


def test_a_file_with_heads_for_several_templates_serves_each(tmp_path, tiny_model):
    """Heads of one prompt fitted under two templates (the zero- and few-shot sets of one model): start-up
    picks the one whose template is the config's; a newer head for a template replaces the older one."""
    other = prompt("a", ["man", "woman", "none"], system="Another system text.")
    first = learned_head(tiny_model)
    second = learned_head(tiny_model, template=template_sha256(other["template"], other["label_prefix"]))
    second.prompts["a"].bias[:] = [1.0, 2.0, 3.0]
    both = first.merged_with(second)
    assert [ph.bias.tolist() for ph in both.candidates("a")] == [[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]
    files.save(both, tmp_path / "h.yaml")
    back = files.load(tmp_path / "h.yaml")
    assert len(back.candidates("a")) == 2 and "variants:" in (tmp_path / "h.yaml").read_text()
    picked = head_for(cfg_with(tmp_path / "h.yaml", prompts=[PROMPTS[0]]))[0].prompts["a"]
    assert picked.bias.tolist() == [0.0, 0.0, 0.0]
    picked = head_for(cfg_with(tmp_path / "h.yaml", prompts=[other]))[0].prompts["a"]
    assert picked.bias.tolist() == [1.0, 2.0, 3.0]
    refit = learned_head(tiny_model)
    refit.prompts["a"].bias[:] = [5.0, 5.0, 5.0]
    again = back.merged_with(refit)
    assert sorted(ph.bias.tolist()[0] for ph in again.candidates("a")) == [1.0, 5.0]


@pytest.mark.parametrize("case,match", [
    ("hidden", r"fitted on hidden states of size 128, this model's are 64 \(qwen3\)"),
    ("layer", r"prompt 'a' reads layer 5, this model has 2 layers \(a head reads layer 1…1 or final\)"),
    ("config", r"fitted on another architecture"),
])
def test_model_config_mismatch_refused(tiny_model, case, match):
    head = learned_head(tiny_model, hidden=128 if case == "hidden" else None, layer=5 if case == "layer" else 1)
    cfg = tiny_model.config
    if case == "config":
        head.meta["fingerprint"]["config"] = "not-this-config"
    with pytest.raises(CalibrationError, match=match):
        check_model_config(head, "h.yaml", cfg)


def test_weights_mismatch_refused_and_fingerprint_independent_of_dtype(tiny_model):
    import torch
    head = learned_head(tiny_model)
    check_model_weights(head, "h.yaml", tiny_model)  # the same weights pass
    assert fp.weights_fingerprint(tiny_model.to(torch.float16)) == head.meta["fingerprint"]["weights"]
    tiny_model.float()
    other = learned_head(tiny_model, weights="feedfacefeedface")
    with pytest.raises(CalibrationError, match=r"fitted on other weights .*weights fingerprint feedfacefeedface"):
        check_model_weights(other, "h.yaml", tiny_model)
    with torch.no_grad():
        tiny_model.model.norm.weight[0] += 1.0
    try:
        with pytest.raises(CalibrationError, match="fitted on other weights"):
            check_model_weights(head, "h.yaml", tiny_model)
    finally:
        with torch.no_grad():
            tiny_model.model.norm.weight[0] -= 1.0
