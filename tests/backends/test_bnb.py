"""bnb-int8 / bnb-nf4: quantized through transformers' integration (or in place for GGUF sources), the
CUDA-graph decision, and the CPU path of bitsandbytes ≥ 0.46 (its GPU path runs in the `gpu` tests)."""
from __future__ import annotations

import builtins
import logging

import pytest
import torch

from qcls.backends import sources
from qcls.backends.bnb import BnbInt8Backend, BnbNf4Backend, bnb_version, quantize_in_place
from qcls.classifier import Classifier
from tests.backends.helpers import cfg, scores

logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # "inputs will be cast to float16" on the CPU


def test_graph_capture_decision():
    int8, nf4 = BnbInt8Backend(), BnbNf4Backend()
    ok, notes = int8.capture("0.50.2", {"threshold": 6.0})
    assert not ok and "threshold=0" in notes[0] and "eagerly" in notes[0]
    assert int8.capture("0.50.2", {"threshold": 0.0}) == (True, [])
    ok, notes = int8.capture("0.44.1", {"threshold": 0.0})
    assert not ok and ">= 0.45" in notes[0] and "0.44.1" in notes[0]
    assert nf4.capture("0.44.0", {}) == (True, [])
    ok, notes = nf4.capture("0.43.3", {})
    assert not ok and ">= 0.44" in notes[0]


def test_missing_bitsandbytes_names_the_install(monkeypatch):
    real = builtins.__import__

    def fake(name, *a, **k):
        if name == "bitsandbytes":
            raise ImportError("No module named 'bitsandbytes'")
        return real(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(ImportError, match=r"pip install 'bitsandbytes>=0.45'"):
        bnb_version()


def test_bad_options(tiny_dirs):
    with pytest.raises(ValueError, match="threshold must be >= 0"):
        BnbInt8Backend().load(cfg(tiny_dirs["qwen3"], "bnb-int8", {"threshold": -1}))
    with pytest.raises(ValueError, match="quant_type must be nf4 or fp4"):
        BnbNf4Backend().load(cfg(tiny_dirs["qwen3"], "bnb-nf4", {"quant_type": "int3"}))


def _bnb():
    return pytest.importorskip("bitsandbytes")


@pytest.mark.parametrize("backend", ["bnb-int8", "bnb-nf4"])
def test_in_place_quantization_equals_the_integration(tiny_dirs, backend):
    """The GGUF route (dequantize, then swap the linears) builds the same model as BitsAndBytesConfig."""
    _bnb()
    b = BnbInt8Backend() if backend == "bnb-int8" else BnbNf4Backend()
    c = cfg(tiny_dirs["llama"], backend)
    qc = b.quant_config({**b.defaults}, torch.float32)
    src = sources.Source(tiny_dirs["llama"])
    cpu = torch.device("cpu")
    a = sources.load_model(src, torch.float32, quantization_config=qc, device_map={"": "cpu"})
    m = sources.load_model(src, torch.float32)
    quantize_in_place(m, qc, cpu)
    assert type(a.model.layers[0].mlp.up_proj) is type(m.model.layers[0].mlp.up_proj)
    ids = torch.tensor([[5, 17, 99, 3, 250]])
    with torch.no_grad():
        assert torch.allclose(a(ids).logits, m(ids).logits, atol=1e-5)
    assert c.backend.name == backend


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_bnb_runs_on_the_cpu_close_to_fp16(tiny_dirs, family):
    _bnb()
    ref = scores(Classifier(cfg(tiny_dirs[family])))
    d8 = (scores(Classifier(cfg(tiny_dirs[family], "bnb-int8", {"threshold": 0.0}))) - ref).abs().max()
    clf4 = Classifier(cfg(tiny_dirs[family], "bnb-nf4"))
    d4 = (scores(clf4) - ref).abs().max()
    assert 0 < d8 < d4 < ref.abs().max()  # int8 is closer to fp16 than 4-bit, and both are near it
    assert type(clf4.loaded.model.model.layers[0].self_attn.q_proj).__name__ == "Linear4bit"
    assert clf4.loaded.memory["weights_cpu"] > 0


# ---- GPU (pytest -m gpu) -------------------------------------------------------------------------------

@pytest.mark.parametrize("backend,options,graphs", [("bnb-int8", {"threshold": 0.0}, True),
                                                     ("bnb-int8", {"threshold": 6.0}, False),
                                                     ("bnb-nf4", {}, True)])
@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_gpu_bnb_graphs_and_scores(tiny_dirs, backend, options, graphs, family):
    _bnb()
    ref = scores(Classifier(cfg(tiny_dirs[family], "fp16", device="cuda")))
    c = cfg(tiny_dirs[family], backend, options, device="cuda")
    clf = Classifier(c)
    assert clf.engine.graphs is graphs
    assert bool(clf.notes) is (not graphs)
    assert clf.loaded.memory["weights_gpu"] > 0
    # relative to the largest |score|: on the CPU int8 is ~2 % off, nf4 ~17 % (random tiny weights)
    assert (scores(clf) - ref).abs().max() < (0.1 if backend == "bnb-int8" else 0.4) * ref.abs().max()
