"""gptq: GPTQ/AWQ checkpoints through transformers + GPTQModel. The packing and the refusals run anywhere;
loading needs gptqmodel (skipped without it; `pytest -m gpu` runs the CUDA kernels)."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from qcls.backends.gptq import GptqBackend, _rtn_pack, write_gptq_checkpoint
from qcls.classifier import Classifier
from tests.backends.helpers import cfg, scores


def _unpack(t: dict, bits: int, group: int) -> torch.Tensor:
    """Dequantize GPTQ v1 tensors back to [out, in] (the reference for what a kernel computes)."""
    per, mask = 32 // bits, 2 ** bits - 1
    qw, qz = t["qweight"], t["qzeros"]
    q = torch.stack([(qw >> (bits * j)) & mask for j in range(per)], 1).reshape(-1, qw.shape[1])
    z = torch.stack([(qz >> (bits * j)) & mask for j in range(per)], 2).reshape(qz.shape[0], -1) + 1
    g = t["g_idx"].long()
    return ((q - z[g]).float() * t["scales"].float()[g]).t()


@pytest.mark.parametrize("bits,group", [(4, 32), (8, 64), (4, 128)])
def test_rtn_pack_round_trips(bits, group):
    w = torch.randn(96, 256) * 0.02
    t = _rtn_pack(w, bits, group)
    assert t["qweight"].dtype == torch.int32 and t["qweight"].shape == (256 * bits // 32, 96)
    assert t["qzeros"].shape == (256 // group, 96 * bits // 32) and t["scales"].shape == (256 // group, 96)
    deq = _unpack(t, bits, group)
    step = t["scales"].float().max()
    assert (deq - w).abs().max() <= step / 2 + 1e-4  # round-to-nearest: within half a step (fp16 scales)


def test_write_gptq_checkpoint(tiny_dirs, tmp_path):
    out = write_gptq_checkpoint(tiny_dirs["llama"], tmp_path / "gptq", bits=4, group_size=32)
    q = json.loads((out / "config.json").read_text())["quantization_config"]
    assert q == {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False, "sym": True,
                 "checkpoint_format": "gptq"}
    sd = load_file(str(out / "model.safetensors"))
    assert "model.layers.0.mlp.up_proj.qweight" in sd and "model.layers.0.mlp.up_proj.weight" not in sd
    assert sd["model.embed_tokens.weight"].dtype == torch.float16 and "lm_head.weight" in sd
    assert (out / "tokenizer.json").is_file()


def test_plain_checkpoint_is_refused_with_the_alternatives(tiny_dirs):
    with pytest.raises(ValueError) as e:
        GptqBackend().load(cfg(tiny_dirs["qwen3"], "gptq"))
    assert "quant_method gptq or awq" in str(e.value) and "bnb-int8" in str(e.value)


def test_unknown_kernel(tiny_dirs):
    with pytest.raises(ValueError, match="unknown kernel 'cutlass'"):
        GptqBackend().load(cfg(tiny_dirs["qwen3"], "gptq", {"kernel": "cutlass"}))


def test_missing_gptqmodel_names_the_install(tiny_dirs, tmp_path):
    try:
        import gptqmodel  # noqa: F401
        pytest.skip("gptqmodel is installed")
    except ImportError:
        pass
    out = write_gptq_checkpoint(tiny_dirs["qwen3"], tmp_path / "gptq", bits=4, group_size=32)
    with pytest.raises(ImportError, match="pip install gptqmodel optimum"):
        GptqBackend().load(cfg(str(out), "gptq"))


@pytest.fixture(scope="module", params=["qwen3", "gemma3"])
def gptq8(request, tiny_dirs, tmp_path_factory):
    """(family, an int8 GPTQ checkpoint written from its tiny fp16 weights): the writer and transformers'
    GPTQ integration touch only the decoder linears, so Gemma3 loads as Qwen3 does."""
    pytest.importorskip("gptqmodel")
    pytest.importorskip("optimum")
    fam = request.param
    return fam, str(write_gptq_checkpoint(tiny_dirs[fam], tmp_path_factory.mktemp("g") / f"g8_{fam}", bits=8,
                                          group_size=32))


def test_gptq_int8_close_to_fp16_on_the_cpu(tiny_dirs, gptq8):
    fam, path = gptq8
    ref = scores(Classifier(cfg(tiny_dirs[fam])))
    clf = Classifier(cfg(path, "gptq", {"kernel": "torch"}))
    assert clf.loaded.dtype == torch.float16 and clf.notes  # says it computes in fp16 on the CPU
    assert (scores(clf) - ref).abs().max() < 0.1 * ref.abs().max()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
@pytest.mark.parametrize("kernel", ["torch"])  # JIT kernels (marlin, exllama_v2) need nvcc: bench them
def test_gpu_gptq(tiny_dirs, gptq8, kernel):
    fam, path = gptq8
    ref = scores(Classifier(cfg(tiny_dirs[fam], "fp16", device="cuda")))
    c = cfg(path, "gptq", {"kernel": kernel}, device="cuda")
    clf = Classifier(c)
    assert clf.loaded.memory["weights_gpu"] > 0 and clf.engine.graphs
    assert (scores(clf) - ref).abs().max() < 0.1 * ref.abs().max()
