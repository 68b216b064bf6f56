"""A Qwen3-8B checkpoint directory without weights: the published config.json and the real Qwen tokenizer."""
from __future__ import annotations

import json

import pytest

# Qwen/Qwen3-8B config.json (the values that shape memory and positions)
QWEN3_8B_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
    "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 151936, "tie_word_embeddings": False, "max_position_embeddings": 40960, "rope_theta": 1000000,
    "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False, "torch_dtype": "bfloat16",
    "bos_token_id": 151643, "eos_token_id": 151645,
}


@pytest.fixture(scope="session")
def qwen3_8b_dir(tmp_path_factory) -> str:
    from qcls.testing.qwen_tokenizer import save_qwen_tokenizer
    out = tmp_path_factory.mktemp("qwen3_8b_no_weights")
    (out / "config.json").write_text(json.dumps(QWEN3_8B_CONFIG))
    save_qwen_tokenizer(out)
    return str(out)
