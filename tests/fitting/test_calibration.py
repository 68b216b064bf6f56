"""Fitting calibrations: fitting lowers NLL on a planted bias, a fitted file round-trips, contextual
calibration is −log p_cf. The file's checks: tests/scoring/test_calibration.py."""
from __future__ import annotations

import math

import numpy as np
import pytest

from qcls.fitting.calibration import contextual, fit
from qcls.heads import files
from qcls.heads.head import PromptHead
from qcls.scoring.tokenization import encode_query
from tests.conftest import prompt, tiny_cfg

LABELS = ["v", "w", "x", "y", "z"]
T0, DELTA, K = 2.5, 1.5, 2  # planted: scores are 2.5× too sharp and label x gets +1.5


def nll(s: np.ndarray, y: np.ndarray) -> float:
    z = s - s.max(1, keepdims=True)
    return float(np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(len(y)), y]))


@pytest.fixture(scope="module")
def planted():
    """True logits u, gold drawn from softmax(u); observed scores = T0·u + DELTA on label K."""
    rng = np.random.default_rng(0)
    u = rng.normal(0, 1.5, (8000, len(LABELS)))
    p = np.exp(u - u.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    y = (p.cumsum(1) > rng.random((len(u), 1))).argmax(1)
    s = T0 * u
    s[:, K] += DELTA
    return s, y


def calibrated(pc: PromptHead, s: np.ndarray) -> np.ndarray:
    return np.array([pc.apply(row) for row in s])


def bias(pc: PromptHead) -> np.ndarray:
    """b of (score + b) / T: the head's constant is b / T."""
    return pc.bias * pc.temperature


def test_fit_recovers_planted_temperature_and_bias(planted):
    s, y = planted
    cal = fit({"p": s}, {"p": y}, {"p": LABELS})
    pc = cal.prompts["p"]
    assert nll(calibrated(pc, s), y) < nll(s, y) - 0.3  # 1.5 → ~1.09 nats
    assert abs(pc.temperature - T0) < 0.15
    want = -DELTA * (np.arange(len(LABELS)) == K)
    want -= want.mean()  # biases are fixed up to a constant: Σb = 0
    assert abs(sum(bias(pc))) < 1e-9
    assert np.abs(bias(pc) - want).max() < 0.25, bias(pc)
    assert cal.method == "temperature_bias" and cal.meta["n"] == {"p": len(y)}
    assert cal.meta["fit"]["p"]["nll_after"] == pytest.approx(nll(calibrated(pc, s), y), abs=1e-5)


def test_temperature_only_and_bias_only(planted):
    s, y = planted
    t_only = fit({"p": s}, {"p": y}, {"p": LABELS}, "temperature").prompts["p"]
    b_only = fit({"p": s}, {"p": y}, {"p": LABELS}, "bias").prompts["p"]
    assert (t_only.bias == 0.0).all() and t_only.temperature > 1.5
    assert b_only.temperature == 1.0 and int(np.argmin(b_only.bias)) == K
    for pc in (t_only, b_only):
        assert nll(calibrated(pc, s), y) < nll(s, y) - 0.05
    both = fit({"p": s}, {"p": y}, {"p": LABELS}).prompts["p"]
    assert nll(calibrated(both, s), y) < min(nll(calibrated(pc, s), y) for pc in (t_only, b_only))


def test_label_without_dev_examples_stays_finite():
    """The L2 term keeps a never-gold label's bias bounded instead of running to −∞."""
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 200)  # label 2 is never gold
    s = 2.0 * np.eye(3)[y] + rng.normal(0, 1, (200, 3))
    pc = fit({"p": s}, {"p": y}, {"p": ["a", "b", "c"]}).prompts["p"]
    assert all(math.isfinite(b) for b in pc.bias) and 0.2 < pc.temperature < 5
    assert -12 < pc.bias[2] < min(pc.bias[:2])  # the head's constant is b / T: the bias in calibrated units
    free = fit({"p": s}, {"p": y}, {"p": ["a", "b", "c"]}, l2=0.0).prompts["p"]
    assert free.bias[2] < pc.bias[2] - 2  # without it, it runs away


def test_fit_is_deterministic_and_checks_shapes(planted):
    s, y = planted
    a, b = (fit({"p": s[:500]}, {"p": y[:500]}, {"p": LABELS}).prompts["p"] for _ in range(2))
    assert a.temperature == b.temperature and np.array_equal(a.bias, b.bias)
    with pytest.raises(ValueError, match=r"prompt 'p': scores of shape \(500, 5\).*3 labels"):
        fit({"p": s[:500]}, {"p": y[:500]}, {"p": ["a", "b", "c"]})
    with pytest.raises(ValueError, match="cannot be fitted"):
        fit({"p": s}, {"p": y}, {"p": LABELS}, "contextual")
    cal = fit({"p": s[:50]}, {"p": y[:50]}, {"p": LABELS, "q": ["a", "b"]})
    assert list(cal.prompts) == ["p"] and cal.meta["skipped (no examples)"] == ["q"]


def test_yaml_round_trip(tmp_path, planted):
    s, y = planted
    labels = ["yes", "no", "null", "1", "女士"]  # YAML would read the first four as bool/None/int unquoted
    cal = fit({"p": s[:300]}, {"p": y[:300]}, {"p": labels}, meta={"strategy": "trie", "model": "tiny",
                                                                     "fitted_on": "dev.jsonl"})
    path = tmp_path / "cal.yaml"
    files.save(cal, path)
    text = path.read_text(encoding="utf-8")
    assert text.startswith("# qcls head") and "女士:" in text and "strategy: trie" in text
    back = files.load(path)
    assert back.method == cal.method and back.meta == cal.meta and list(back.prompts) == list(cal.prompts)
    a, b = cal.prompts["p"], back.prompts["p"]
    assert b.labels == a.labels and b.temperature == pytest.approx(a.temperature, rel=1e-12)
    assert np.allclose(b.bias, a.bias, rtol=1e-12, atol=1e-15)


# ---- contextual calibration --------------------------------------------------------------------------
def test_contextual_is_minus_log_p_cf(tiny_dirs):
    """b = −log of the content-free label probabilities, averaged over the inputs, computed here by hand from
    the reference engine's raw scores; T = 1."""
    from qcls.backends.registry import get_backend
    from qcls.classifier import Classifier
    prompts = [prompt("a", ["man", "manager", "woman", "none"]), prompt("b", ["dress", "jeans", "tee"], system="B?")]
    cfg = tiny_cfg(tiny_dirs["qwen3"], prompts)
    loaded = get_backend("fp16").load(cfg)
    fast = Classifier(cfg, loaded=loaded)
    ref = Classifier(tiny_cfg(tiny_dirs["qwen3"], prompts, engine={"kind": "reference"}), loaded=loaded)
    inputs = ("N/A", "[MASK]")
    cal = contextual(fast, inputs)
    assert cal.method == "contextual" and cal.meta["strategy"] == "trie" and cal.meta["prompts"] == ["a", "b"]
    ids = [encode_query(ref.tokenizer, q, 16) for q in inputs]
    raw = ref.engine.run(ids)[0]  # [input][prompt][label] scores
    for i, name in enumerate(["a", "b"]):
        probs = [np.exp(np.array(r[i]) - max(r[i])) / np.exp(np.array(r[i]) - max(r[i])).sum() for r in raw]
        want = -np.log(np.mean(probs, 0))
        pc = cal.prompts[name]
        assert pc.temperature == 1.0 and pc.labels == prompts[i]["labels"]
        assert np.abs(np.array(pc.bias) - want).max() < 1e-4
    with pytest.raises(ValueError, match="content-free inputs refused.*empty query"):
        contextual(fast, ("", "N/A"))
