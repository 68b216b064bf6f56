"""gptq backend on AWQ checkpoints: transformers' AWQ integration on GPTQModel, run on the CPU with GPTQModel's
torch AWQ kernel (`kernel: torch` → `torch_awq`). The checkpoint is write_awq_checkpoint's round-to-nearest
AWQ "gemm" packing of the tiny Qwen3; skipped when gptqmodel cannot be imported."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from qcls.backends.gptq import AWQ_ORDER, _awq_pack, write_awq_checkpoint
from qcls.classifier import Classifier
from tests.backends.helpers import cfg, scores

GROUP = 32


def _unpack(t: dict, group: int) -> torch.Tensor:
    """Dequantize AWQ gemm int4 tensors back to [out, in] in fp16, as (q - zero) * scale."""
    undo = [AWQ_ORDER.index(j) for j in range(8)]  # nibble holding natural column j of each 8

    def codes(p: torch.Tensor) -> torch.Tensor:
        c = torch.stack([(p >> (4 * j)) & 15 for j in range(8)], -1)[..., undo]
        return c.reshape(p.shape[0], -1)
    q, z = codes(t["qweight"]), codes(t["qzeros"]).repeat_interleave(group, 0)
    return ((q - z).half() * t["scales"].repeat_interleave(group, 0)).t()


def test_awq_pack_round_trips():
    w = torch.randn(96, 256) * 0.02
    t = _awq_pack(w, GROUP)
    assert t["qweight"].dtype == t["qzeros"].dtype == torch.int32 and t["scales"].dtype == torch.float16
    assert t["qweight"].shape == (256, 96 // 8) and t["qzeros"].shape == (256 // GROUP, 96 // 8)
    assert t["scales"].shape == (256 // GROUP, 96)
    deq = _unpack(t, GROUP).float()
    assert (deq - w).abs().max() <= t["scales"].float().max() / 2 + 1e-4  # round-to-nearest: half a step


@pytest.fixture(scope="module")
def gptqmodel(tmp_path_factory):
    """GPTQModel, imported with bench's `pcre` shim where pypcre is missing; skips when it cannot be imported."""
    from bench.backends import ensure_pcre
    shim = ensure_pcre(tmp_path_factory.mktemp("pcre"))
    try:
        import gptqmodel
    except Exception as e:  # not installed, or a missing dependency / native library failure at import
        pytest.skip(f"gptqmodel cannot be imported ({type(e).__name__}: {e}): pip install gptqmodel")
    finally:
        if shim:  # `pcre` stays imported; only the search path is restored
            sys.path[:] = [p for p in sys.path if not p.endswith("pcre-shim")]
    return gptqmodel


@pytest.fixture(scope="module")
def awq_dirs(tiny_dirs, tmp_path_factory, gptqmodel):
    """The AWQ checkpoint, and a plain fp32 checkpoint holding exactly the weights it encodes."""
    root = tmp_path_factory.mktemp("awq")
    awq = write_awq_checkpoint(tiny_dirs["qwen3"], root / "awq", group_size=GROUP)
    deq = root / "dequantized"
    shutil.copytree(tiny_dirs["qwen3"], deq)
    sd, packed = load_file(str(deq / "model.safetensors")), load_file(str(awq / "model.safetensors"))
    for name in [n for n in sd if ".layers." in n and n.endswith("_proj.weight")]:
        p = name[: -len("weight")]
        sd[name] = _unpack({k: packed[p + k] for k in ("qweight", "qzeros", "scales")}, GROUP).float().contiguous()
    save_file(sd, str(deq / "model.safetensors"), metadata={"format": "pt"})
    return str(awq), str(deq), packed


def test_write_awq_checkpoint(awq_dirs):
    awq, _, sd = awq_dirs
    q = json.loads(Path(awq, "config.json").read_text())["quantization_config"]
    assert q == {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm"}
    assert "model.layers.0.mlp.up_proj.qweight" in sd and "model.layers.0.mlp.up_proj.weight" not in sd
    assert "model.layers.0.mlp.up_proj.g_idx" not in sd and sd["model.embed_tokens.weight"].dtype == torch.float16


def test_awq_packing_matches_gptqmodel(gptqmodel):
    from gptqmodel.quantization.awq.utils.packing_utils import dequantize_gemm
    t = _awq_pack(torch.randn(64, 128) * 0.05, GROUP)
    ref = dequantize_gemm(t["qweight"], t["qzeros"], t["scales"], 4, GROUP)  # [in, out]
    assert torch.equal(ref, _unpack(t, GROUP).t())


def test_awq_on_the_cpu_through_the_torch_kernel(awq_dirs):
    awq, deq, sd = awq_dirs
    clf = Classifier(cfg(awq, "gptq", {"kernel": "torch"}))
    assert clf.loaded.dtype == torch.float16 and clf.notes  # says it computes in fp16 on the CPU
    layer = clf.loaded.model.model.layers[0].mlp.up_proj
    assert type(layer).__name__ == "AwqTorchLinear"
    # the kernel computes x @ (q - zero) * scale: exactly this checkpoint's dequantized weight
    x = torch.randn(5, layer.in_features, dtype=torch.float16)
    w = _unpack({k: sd["model.layers.0.mlp.up_proj." + k] for k in ("qweight", "qzeros", "scales")}, GROUP)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), x @ w.t(), rtol=1e-3, atol=1e-3)
    # whole-model scores: those of the fp16 backend (fp32 on the CPU) on the same (dequantized) weights
    ref = scores(Classifier(cfg(deq)))
    assert (scores(clf) - ref).abs().max() < 0.02 * ref.abs().max()
