"""The head file (qcls/heads/files.py): round trips of calibrations and learned heads, and every malformed
file refused with the file and the reason; the head's own math (qcls/heads/head.py)."""
from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from qcls.heads import files
from qcls.heads.files import CalibrationError
from qcls.heads.head import Head, PromptHead, Read, Tap


def test_temperature_bias_is_an_affine_head():
    ph = PromptHead.temperature_bias(["a", "b"], 2.0, [1.0, -1.0])
    assert ph.apply([0.5, 0.5]) == [0.75, -0.25]  # (s + b) / T
    assert ph.is_temperature_bias and ph.temperature == 2.0
    head = Head({"p": ph}, "temperature_bias")
    assert head.apply("other", [0.5, -3.0]) == [0.5, -3.0]  # a prompt without a head keeps its raw scores
    assert not head.reads_states and head.reads_scores and head.taps() == []


def test_learned_head_math_and_reorder():
    rng = np.random.default_rng(0)
    ws, wf, c = rng.normal(size=(3, 3)), rng.normal(size=(3, 8)), rng.normal(size=3)
    ph = PromptHead(["x", "y", "z"], c, ws, wf, Read(2, "both"))
    s, f = rng.normal(size=3), rng.normal(size=8)
    assert np.allclose(ph.apply(s, f), ws @ s + wf @ f + c)
    r = ph.reorder(["z", "x", "y"])
    got = dict(zip(r.labels, r.apply(s[[2, 0, 1]], f)))  # the scores come in the new label order too
    assert got == pytest.approx(dict(zip(ph.labels, ph.apply(s, f))), abs=1e-12)
    assert [t.name for t in Read(2, "both").taps] == ["position@2", "query_mean@2"]
    with pytest.raises(ValueError, match="needs the query's features|give the query's features"):
        ph.apply(s)


@pytest.mark.parametrize("layer,kind,match", [(0, "position", "layer count ≥ 1"), ("final", "query_mean",
                                              "needs an intermediate layer"), (3, "mean", "head read is one of")])
def test_bad_reads_refused(layer, kind, match):
    with pytest.raises(ValueError, match=match):
        Read(layer, kind)


def learned(tmp_path, scores=True, read=Read(3, "both"), hidden=4):
    rng = np.random.default_rng(1)
    n = 3
    ph = PromptHead(["a", "b", "c"], rng.normal(size=n), rng.normal(size=(n, n)) if scores else None,
                    rng.normal(size=(n, hidden * len(read.taps))) if read else None, read,
                    {"C": 0.1, "cv_accuracy": 0.5, "template_sha256": "abc"})
    head = Head({"p": ph, "q": PromptHead.temperature_bias(["u", "v"], 1.5, [0.2, -0.2])}, "head",
                {"model": "m", "hidden_size": hidden})
    path = tmp_path / "h.yaml"
    files.save(head, path)
    return head, path


@pytest.mark.parametrize("scores,read", [(True, Read(3, "both")), (False, Read("final", "position")),
                                         (True, None)])
def test_round_trip(tmp_path, scores, read):
    head, path = learned(tmp_path, scores, read)
    got = files.load(path)
    assert (path.with_suffix(".safetensors")).is_file() and "weights: h.safetensors" in path.read_text()
    assert got.method == "head" and got.meta == head.meta and list(got.prompts) == ["p", "q"]
    a, b = head.prompts["p"], got.prompts["p"]
    assert b.labels == a.labels and b.read == a.read and b.info == a.info
    assert np.allclose(a.bias, b.bias, atol=1e-6)  # stored as float32
    for x, y in ((a.score_weights, b.score_weights), (a.feature_weights, b.feature_weights)):
        assert (x is None and y is None) or np.allclose(x, y, atol=1e-6)
    q = got.prompts["q"]
    assert q.is_temperature_bias and q.temperature == pytest.approx(1.5) and "temperature: 1.5" in path.read_text()


def test_calibration_only_file_has_no_weights_file(tmp_path):
    path = tmp_path / "cal.yaml"
    files.save(Head({"p": PromptHead.temperature_bias(["a", "b"], 2.0, [0.5, -0.5])}, "temperature_bias"), path)
    assert not path.with_suffix(".safetensors").exists()
    assert files.load(path).prompts["p"].apply([0.0, 0.0]) == pytest.approx([0.25, -0.25])


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
    "head typo": ("method: head\nweights: w.safetensors\nprompts: {p: {labels: [a, b], raed: {layer: 2}}}\n",
                  r"prompts.p.raed: Extra inputs"),
    "head no weights key": ("method: head\nprompts: {p: {labels: [a, b], scores: true}}\n",
                            r"need the `weights` key"),
    "head missing file": ("method: head\nweights: nope.safetensors\nprompts: {p: {labels: [a, b], scores: true}}\n",
                          r"nope.safetensors cannot be read"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_files_refused_with_file_and_reason(tmp_path, case):
    text, reason = BAD[case]
    path = tmp_path / f"{case.replace(' ', '_')}.yaml"
    path.write_text(text)
    with pytest.raises(CalibrationError, match=reason) as e:
        files.load(path)
    assert str(path) in str(e.value)


@pytest.mark.parametrize("case,match", [
    ("nan", r"'p.features' are not all finite"),
    ("inf bias", r"'p.bias' are not all finite"),
    ("shape", r"'p.scores' have shape \[2, 3\], want \[3, 3\]"),
    ("missing", r"scores: true but the weights file has no 'p.scores'"),
])
def test_bad_weights_refused(tmp_path, case, match):
    _, path = learned(tmp_path)
    wpath = path.with_suffix(".safetensors")
    t = load_file(str(wpath))
    if case == "nan":
        t["p.features"][0, 1] = np.nan
    elif case == "inf bias":
        t["p.bias"][2] = np.inf
    elif case == "shape":
        t["p.scores"] = t["p.scores"][:2]
    else:
        del t["p.scores"]
    save_file(t, str(wpath))
    with pytest.raises(CalibrationError, match=match):
        files.load(path)


def test_taps_are_collected_once_in_order():
    head = Head({"a": PromptHead(["x", "y"], np.zeros(2), None, np.zeros((2, 8)), Read(2, "both")),
                 "b": PromptHead(["x", "y"], np.zeros(2), None, np.zeros((2, 4)), Read(2, "position")),
                 "c": PromptHead(["x", "y"], np.zeros(2), None, np.zeros((2, 4)), Read("final"))}, "head")
    assert head.taps() == [Tap(2, "position"), Tap(2, "query_mean"), Tap("final", "position")]
    assert head.reads_states and not head.reads_scores
