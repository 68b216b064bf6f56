"""The calibration file and its start-up checks (qcls/scoring/calibration.py); fitting is tested in
tests/eval/test_calibration.py."""
from __future__ import annotations

import pytest

from qcls.compose import validate
from qcls.scoring.calibration import Calibration, CalibrationError, PromptCalibration, calibration_for
from tests.conftest import prompt

def test_apply_and_identity():
    cal = Calibration({"p": PromptCalibration(["a", "b"], 2.0, [1.0, -1.0])}, "temperature_bias", {})
    assert cal.apply("p", [0.5, 0.5]) == [0.75, -0.25]
    assert cal.apply("other", [0.5, -3.0]) == [0.5, -3.0]
    assert cal.affine("other", 3) == (1.0, [0.0, 0.0, 0.0])


BAD = {
    "not yaml": ("method: [bias\n", "not valid YAML"),
    "no prompts": ("method: bias\n", r"prompts: Field required"),
    "unknown key": ("method: bias\nprompts: {p: {temperature: 1, bias: {a: 0, b: 0}}}\nextra: 1\n",
                    r"extra: Extra inputs"),
    "bad method": ("method: platt\nprompts: {p: {temperature: 1, bias: {a: 0, b: 0}}}\n", r"method: Input should be"),
    "temperature 0": ("method: bias\nprompts: {p: {temperature: 0, bias: {a: 0, b: 0}}}\n",
                      r"prompts.p.temperature: Input should be greater than 0"),
    "nan bias": ("method: bias\nprompts: {p: {temperature: 1, bias: {a: .nan, b: 0}}}\n", r"prompts.p.bias.a"),
    "unquoted yes": ("method: bias\nprompts: {p: {temperature: 1, bias: {yes: 0, b: 0}}}\n",
                     r"prompts.p.bias: label True is not a string \(quote label names"),
    "one label": ("method: bias\nprompts: {p: {temperature: 1, bias: {a: 0}}}\n", r"prompts.p.bias: .*at least 2"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_files_refused_with_file_and_reason(tmp_path, case):
    text, reason = BAD[case]
    path = tmp_path / f"{case.replace(' ', '_')}.yaml"
    path.write_text(text)
    with pytest.raises(CalibrationError, match=reason) as e:
        Calibration.load(path)
    assert str(path) in str(e.value)


# ---- start-up checks against the config --------------------------------------------------------------
def cfg_with(path, strategy="trie", prompts=None):
    prompts = prompts or [prompt("a", ["man", "woman", "none"]), prompt("b", ["dress", "jeans"])]
    return validate({"model": {"name": "m", "source": "local", "path": "/nonexistent"}, "prompts": prompts,
                     "scoring": {"name": strategy}, "calibration": str(path)})


def write(tmp_path, prompts: dict[str, dict[str, float]], strategy="trie", name="cal.yaml"):
    cal = Calibration({p: PromptCalibration(list(b), 1.5, list(b.values())) for p, b in prompts.items()},
                      "temperature_bias", {"strategy": strategy, "model": "m"})
    cal.save(tmp_path / name)
    return tmp_path / name


def test_startup_reorders_to_config_labels_and_notes_missing_prompts(tmp_path):
    path = write(tmp_path, {"a": {"none": 0.3, "man": 0.1, "woman": -0.4}})
    cal, where, notes = calibration_for(cfg_with(path))
    assert where == str(path.resolve())
    assert cal.prompts["a"].labels == ["man", "woman", "none"] and cal.prompts["a"].bias == [0.1, -0.4, 0.3]
    assert cal.apply("b", [1.0, 2.0]) == [1.0, 2.0]
    assert any("no entry for prompts ['b']" in n for n in notes)


@pytest.mark.parametrize("case,match", [
    ("strategy", r"fitted under scoring=exact, but this config scores with scoring=trie.*add the override "
                 r"scoring=exact"),
    ("extra prompt", r"calibrates prompts \['zz'\] that the config lacks"),
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
        calibration_for(cfg_with(path))
    assert str(path.resolve()) in str(e.value)


def test_startup_path_resolution(tmp_path, monkeypatch):
    """Relative paths: the current directory first, then the repository root (conf_dir().parent)."""
    write(tmp_path, {"a": {"man": 0.0, "woman": 0.0, "none": 0.0}})
    monkeypatch.chdir(tmp_path)
    assert calibration_for(cfg_with("cal.yaml"))[1] == str((tmp_path / "cal.yaml").resolve())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr("qcls.compose.conf_dir", lambda: tmp_path / "conf")
    assert calibration_for(cfg_with("cal.yaml"))[1] == str((tmp_path / "cal.yaml").resolve())
    assert calibration_for(cfg_with(tmp_path / "cal.yaml"))[0] is not None  # absolute
    with pytest.raises(CalibrationError, match=r"'nope.yaml' not found \(looked at .*elsewhere/nope.yaml, "
                                               r".*nope.yaml\).*calibration=null"):
        calibration_for(cfg_with("nope.yaml"))


def test_classifier_refuses_before_weights_load(tmp_path, monkeypatch):
    from qcls.backends import sources
    from qcls.classifier import Classifier

    def nothing(*a, **k):
        raise AssertionError("the tokenizer or weights were loaded before the calibration was checked")
    monkeypatch.setattr(sources, "load_tokenizer", nothing)
    path = write(tmp_path, {"zz": {"x": 0.0, "y": 0.0}})
    with pytest.raises(CalibrationError, match="calibrates prompts"):
        Classifier(cfg_with(path))
