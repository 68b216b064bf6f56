"""The start-up memory estimate on the real Qwen3 shapes (from the config alone) and the budget check."""
from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config

from qcls.backends import memory as M
from qcls.config.compose import compose

SHAPE = dict(num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936)
QWEN3_8B = Qwen3Config(hidden_size=4096, intermediate_size=12288, tie_word_embeddings=False, **SHAPE)
QWEN3_4B = Qwen3Config(hidden_size=2560, intermediate_size=9728, tie_word_embeddings=True, **SHAPE)
T4 = ["prompts=ecommerce8", "gpu=t4"]


def est(model_config, backend, *over, budget_gib=None):
    c = compose(T4 + [f"backend={backend}", *over])
    return c, M.estimate(c, model_config, budget=int(budget_gib * M.GIB) if budget_gib else None)


def test_param_counts_match_the_published_sizes():
    pc8, pc4 = M.param_counts(QWEN3_8B), M.param_counts(QWEN3_4B)
    layers8 = pc8.layers * (pc8.layer_linear + pc8.layer_other) * 2
    assert layers8 / 1e9 == pytest.approx(13.9, abs=0.05)  # facts.md: 13.9 GB of decoder layers
    whole8 = layers8 + (pc8.embed + pc8.head + pc8.final_norm) * 2
    assert whole8 / 1e9 == pytest.approx(16.4, abs=0.05)  # and 16.4 GB whole
    assert pc4.head == 0  # tied
    assert pc4.layers * (pc4.layer_linear + pc4.layer_other) * 2 / 1e9 == pytest.approx(7.27, abs=0.02)


def test_qwen3_8b_fp16_is_refused_on_a_t4_naming_what_fits():
    c, e = est(QWEN3_8B, "fp16")
    assert e.total > 15 * M.GIB
    with pytest.raises(M.MemoryBudgetError) as err:
        M.check_budget(c, e)
    msg = str(err.value)
    assert "15.00 GiB" in msg and "gpu_memory_gib" in msg and f"{e.total / M.GIB:.2f} GiB" in msg
    assert "backend=fp16-offload" in msg and "backend=bnb-int8" in msg and "backend=bnb-nf4" in msg


def test_qwen3_8b_fp16_offload_fits_a_t4_with_every_layer_on_the_gpu():
    c, e = est(QWEN3_8B, "fp16-offload")
    assert e.layers_on_gpu == e.n_layers == 36 and e.streamed_bytes == 0
    assert 13.9e9 < e.weights_gpu < 14.1e9  # the layers, not the 2.5 GB of embedding + head
    assert e.weights_cpu / 1e9 == pytest.approx(2.49, abs=0.02)
    assert e.total <= 15 * M.GIB
    M.check_budget(c, e)


def test_qwen3_4b_fp16_fits_a_t4():
    c, e = est(QWEN3_4B, "fp16")
    assert 7.5e9 < e.weights_gpu < 8.3e9 and e.total <= 15 * M.GIB
    M.check_budget(c, e)


def test_quantized_backends_are_smaller_in_order():
    totals = {b: est(QWEN3_8B, b)[1].weights_gpu for b in ("fp16", "bnb-int8", "bnb-nf4")}
    assert totals["fp16"] > totals["bnb-int8"] > totals["bnb-nf4"]
    assert totals["bnb-int8"] / 1e9 == pytest.approx(6.95 + 2.49, abs=0.3)  # int8 layers + fp16 embed/head


def test_gptq_reads_bits_from_the_checkpoint_config():
    q8 = Qwen3Config(**QWEN3_8B.to_dict())
    q8.quantization_config = {"quant_method": "gptq", "bits": 8, "group_size": 128}
    q4 = Qwen3Config(**QWEN3_8B.to_dict())
    q4.quantization_config = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    assert est(q8, "gptq")[1].weights_gpu > est(q4, "gptq")[1].weights_gpu + 3e9


def test_offload_streams_layers_when_even_the_layers_do_not_fit():
    c, e = est(QWEN3_8B, "fp16-offload", budget_gib=10.0)
    assert 0 < e.layers_on_gpu < e.n_layers and e.total <= 10 * M.GIB
    assert e.streamed_bytes == (e.n_layers - e.layers_on_gpu) * 385_892_864  # bytes of one Qwen3-8B layer
    M.check_budget(c, e)
    c, e = est(QWEN3_8B, "fp16-offload", "backend.options.offload_layers=false", budget_gib=10.0)
    assert e.layers_on_gpu == e.n_layers
    with pytest.raises(M.MemoryBudgetError, match="backend=bnb-nf4"):
        M.check_budget(c, e)


def test_full_head_adds_the_vocabulary_rows():
    _, plain = est(QWEN3_8B, "fp16-offload", budget_gib=40)
    _, full = est(QWEN3_8B, "fp16-offload", "backend.options.full_head=true", budget_gib=40)
    assert full.layers_on_gpu == plain.layers_on_gpu == 36
    assert full.weights_gpu - plain.weights_gpu == pytest.approx(151936 * 4096 * 2 * 1.01, rel=0.01)


def test_full_head_does_not_fit_qwen3_8b_on_a_t4_whole():
    c, e = est(QWEN3_8B, "fp16-offload", "backend.options.full_head=true", "backend.options.offload_layers=false")
    with pytest.raises(M.MemoryBudgetError):
        M.check_budget(c, e)


def test_more_buckets_cost_kv_and_activations():
    _, small = est(QWEN3_8B, "fp16", "engine.max_batch_size=1")
    _, big = est(QWEN3_8B, "fp16")
    assert big.kv_buffer > 2 * small.kv_buffer and big.activations > 2 * small.activations
    # KV per token: layers × (K, V) × kv heads × head_dim × 2 bytes
    assert big.kv_buffer % (36 * 2 * 8 * 128 * 2) == 0


def test_no_budget_on_the_cpu_means_no_check(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    c = compose(["prompts=ecommerce8"])
    e = M.estimate(c, QWEN3_8B, backend="fp16")
    assert e.budget is None
    M.check_budget(c, e)  # nothing to compare with


def test_cpu_backends_skip_the_preflight(tiny_dirs):
    from qcls.backends.registry import get_backend
    from tests.backends.helpers import cfg
    c = cfg(tiny_dirs["qwen3"], "fp16-offload", gpu_memory_gib=0.001)
    assert get_backend("fp16-offload").preflight(c, None, torch.device("cpu")) is None


# google/gemma-3-4b-it's text_config (its published config.json sets these; the rest are Gemma3TextConfig's
# defaults: 8 / 4 heads, head_dim 256, vocabulary 262208, query_pre_attn_scalar 256, a global layer every 6)
GEMMA3_4B = dict(hidden_size=2560, intermediate_size=10240, num_hidden_layers=34, sliding_window=1024,
                 rope_scaling={"factor": 8.0, "rope_type": "linear"})


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "llama", "gemma3", "gemma3_4b"])
def test_param_counts_equal_the_built_model(family):
    """The estimate's parameter counts are exactly those of the transformers model built from the config
    (on the meta device: no memory)."""
    from transformers import AutoModelForCausalLM, Gemma3TextConfig

    from qcls.testing.tiny_models import tiny_config
    mc = Gemma3TextConfig(**GEMMA3_4B) if family == "gemma3_4b" else tiny_config(family, 1024)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(mc)
    pc = M.param_counts(mc)
    layer = sum(p.numel() for p in model.model.layers[0].parameters())
    linear = sum(m.weight.numel() for m in model.model.layers[0].modules() if isinstance(m, torch.nn.Linear))
    assert (pc.layer_linear, pc.layer_other) == (linear, layer - linear)
    assert pc.layers * (pc.layer_linear + pc.layer_other) == sum(p.numel() for p in model.model.layers.parameters())
    assert pc.embed == model.model.embed_tokens.weight.numel()
    assert pc.head == (0 if mc.tie_word_embeddings else model.lm_head.weight.numel())


def test_gemma3_4b_fp16_fits_a_t4():
    from transformers import Gemma3TextConfig
    c, e = est(Gemma3TextConfig(**GEMMA3_4B), "fp16")
    assert 7.7e9 < e.weights_gpu < 8.0e9 and e.total <= 15 * M.GIB  # 3.21e9 layer + 0.67e9 embedding params
    M.check_budget(c, e)


def test_qwen3_8b_fp16_fits_a_t4_when_the_forward_stops_at_layer_20():
    """Only the layers a head reads are loaded (and no untied LM head): Qwen3-8B in fp16 fits a 16 GB T4 with a head
    at layer 20 of 36, not at every layer; the estimate says how many layers it counts."""
    c, whole = est(QWEN3_8B, "fp16")
    cut = M.estimate(c, QWEN3_8B, layers=20)
    assert whole.total > 15 * M.GIB >= cut.total
    pc = M.param_counts(QWEN3_8B)
    layer = (pc.layer_linear + pc.layer_other) * 2
    # 16 layers and the [V, H] head fewer, with the estimate's fragmentation margin
    assert whole.weights_gpu - cut.weights_gpu == pytest.approx((16 * layer + pc.head * 2) * (1 + M.FRAGMENTATION),
                                                                rel=1e-6)
    assert cut.kv_buffer * 36 == whole.kv_buffer * 20
    assert "the first 20 of 36 decoder layers" in cut.summary()
    M.check_budget(c, cut)  # no refusal
    with pytest.raises(M.MemoryBudgetError):
        M.check_budget(c, whole)
