"""Tiny random-weight checkpoints of real decoder architectures, for tests.

Everything is written as an ordinary local HF directory (config.json,
model.safetensors, tokenizer files), so code under test goes through the same
``from_pretrained(<dir>)`` path it uses for real checkpoints.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerFast

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

# torch and the architectures are imported where a model is built: the tokenizer alone loads in a fraction of the
# time (a fresh interpreter checking that the tokenizer is the same everywhere needs only it)

__all__ = [
    "TINY_FAMILIES",
    "tiny_config",
    "tiny_vocab_size",
    "make_tiny_model_dir",
    "tiny_byte_tokenizer",
]

TINY_FAMILIES: tuple[str, ...] = ("qwen3", "qwen2", "llama", "gemma3")


def _config_class(family: str) -> type[PretrainedConfig]:
    import transformers
    return {"qwen3": transformers.Qwen3Config, "qwen2": transformers.Qwen2Config, "llama": transformers.LlamaConfig,
            "gemma3": transformers.Gemma3TextConfig}[family]

# transformers 5 replaced rope_theta/rope_scaling kwargs with a single
# rope_parameters dict (rope_scaling is a deprecated alias).
_ROPE: dict[str, dict[str, Any]] = {
    "qwen3": {"rope_type": "default", "rope_theta": 1_000_000.0},
    "qwen2": {"rope_type": "default", "rope_theta": 1_000_000.0},
    # Llama-3.1 style scaling. original_max_position_embeddings=128 with
    # head_dim 16 / theta 5e5 puts rotary bands in all three llama3 regimes
    # (kept, smoothly interpolated, divided by factor), so a backend that
    # ignores rope_type produces visibly different logits.
    "llama": {
        "rope_type": "llama3",
        "rope_theta": 500_000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 128,
    },
}

# Gemma3: local (sliding-window) and global layers mixed, each kind with its own RoPE (the global one
# linearly scaled as in Gemma3-4B), one KV head as in gemma-3-270m, heads × head_dim ≠ hidden as there
# (4 × 32 here; 4 × 256 over 640 there; 32 also keeps every linear's output a multiple of 32, which
# bitsandbytes' CPU 4-bit kernel needs). A window of 8 tokens is shorter than any test prompt's prefix, so
# the window hides keys there; query_pre_attn_scalar 24 ≠ head_dim makes a wrong softmax scale visible.
_GEMMA3: dict[str, Any] = {
    "num_hidden_layers": 3,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "num_key_value_heads": 1,
    "head_dim": 32,
    "sliding_window": 8,
    "query_pre_attn_scalar": 24,
    "hidden_activation": "gelu_pytorch_tanh",
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "linear", "rope_theta": 1_000_000.0, "factor": 8.0},
    },
    "tie_word_embeddings": True,
}
# Init scales chosen by measurement on the tiny vocab: next-token entropy
# ~2.3 nats (max prob ~0.4), strong dependence on earlier tokens, and the tied
# qwen3 model echoing its input token at only ~2% of positions (with gain 1.0
# it echoes ~50%, since a tied head scores the residual against embeddings).
_EMBED_STD = 0.5
_LINEAR_GAIN = 1.5  # weight std = gain / sqrt(fan_in)
_BIAS_STD = 0.1
_NORM_JITTER = 0.1  # norms != 1 so a loader that drops norm weights is caught


def tiny_vocab_size(tokenizer: PreTrainedTokenizerBase) -> int:
    """len(tokenizer) (added tokens included) rounded up to a multiple of 64, like real padded vocabs."""
    return -(-len(tokenizer) // 64) * 64


def tiny_config(family: str, vocab_size: int, **overrides: Any) -> PretrainedConfig:
    """Config of the real architecture ``family`` shrunk to ~100k non-embedding params."""
    if family not in TINY_FAMILIES:
        raise ValueError(f"unknown family {family!r}; expected one of {TINY_FAMILIES}")
    kwargs: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # GQA, so kv-head repetition is exercised
        head_dim=16,
        intermediate_size=128,
        rms_norm_eps=1e-6,
        max_position_embeddings=512,
        rope_parameters=dict(_ROPE.get(family, {})),
        tie_word_embeddings=(family == "qwen3"),
        hidden_act="silu",
        use_cache=True,
    )
    if family in ("qwen3", "qwen2"):
        kwargs.update(use_sliding_window=False, max_window_layers=2)
    if family == "gemma3":
        del kwargs["hidden_act"]
        kwargs.update(_GEMMA3)
    kwargs.update(overrides)
    return _config_class(family)(**kwargs)


def _init_weights(model: PreTrainedModel, seed: int) -> None:
    import torch
    with torch.no_grad():
        _init_weights_from(model, torch.Generator().manual_seed(seed))


def _init_weights_from(model: PreTrainedModel, gen) -> None:
    # Our own generator instead of relying on from_config's init, so weights
    # depend only on (architecture, seed) and not on transformers' init code
    # or the caller's global RNG.
    import torch
    embed = model.get_input_embeddings().weight
    lm_head = model.get_output_embeddings()
    lm_weight = lm_head.weight if lm_head is not None else None
    # named_parameters() yields a tied lm_head only once (as the embedding).
    for name, param in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
        if param is embed or param is lm_weight:
            # Gemma3's embedding module multiplies rows by √hidden: at the plain std the tied model only
            # echoes its input; dividing by the scale's square root keeps it peaked but context-dependent
            scale = float(getattr(model.get_input_embeddings(), "scalar_embed_scale", 1.0))
            param.copy_(noise * _EMBED_STD / scale**0.5)
        elif "norm" in name:
            param.copy_(1.0 + _NORM_JITTER * noise)
        elif param.dim() == 1:
            # qwen2's q/k/v biases: non-zero so a loader that drops them is caught.
            param.copy_(noise * _BIAS_STD)
        else:
            # gain/sqrt(fan_in) keeps each block's output O(1), comparable to
            # the embedding stream; the usual std 0.02 makes a 64-wide model
            # nearly ignore context (and tied qwen3 just echo the last token).
            param.copy_(noise * (_LINEAR_GAIN / param.shape[-1] ** 0.5))


def make_tiny_model_dir(
    path: str | Path,
    family: str,
    tokenizer: PreTrainedTokenizerBase,
    seed: int = 0,
    **config_overrides: Any,
) -> Path:
    """Write a float32 random ``family`` checkpoint plus ``tokenizer`` into ``path``.

    The same (family, tokenizer, seed, overrides) always gives bit-identical
    weights. Returns ``path``.
    """
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    special_ids: dict[str, Any] = {
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
    }
    config = tiny_config(family, tiny_vocab_size(tokenizer), **{**special_ids, **config_overrides})
    import torch
    from transformers import AutoModelForCausalLM
    # fork_rng: from_config's default init draws from the global RNG; keep the
    # caller's RNG stream untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _init_weights(model, seed)
    model.eval()
    if model.generation_config is not None:
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.save_pretrained(str(out))  # transformers 5 always writes safetensors
    tokenizer.save_pretrained(str(out))
    return out


# --- tiny byte-level tokenizer -------------------------------------------------

# Same split regex as Qwen2/3 so whitespace/CJK handling matches the real thing.
_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

_EN_WORDS = (
    "dress jeans shirt trench coat skirt tee hoodie knit sweater cardigan jacket blazer vest "
    "pants trousers shorts leggings suit coat parka down puffer windbreaker blouse polo tank top "
    "sneakers boots sandals heels loafers slippers socks scarf hat cap gloves belt bag backpack "
    "boy girl man woman men women kids baby toddler teen pregnant maternity unisex adult child "
    "other none unknown category label query product item size color style season fabric "
    "red black white blue green pink grey navy beige brown yellow purple khaki denim cotton "
    "linen silk wool cashmere leather polyester spandex summer winter spring autumn fall "
    "slim loose oversized cropped long short sleeve sleeveless casual formal sport outdoor "
    "new sale cheap discount free shipping official store brand original plus petite "
    "you are a classifier classify the into one of following categories answer with only "
    "system user assistant input output gender target audience for and or is it this that"
)

_ZH_WORDS = (
    "男童 女童 男士 女士 孕妇 婴儿 儿童 成人 中性 无 其他 未知 连衣裙 牛仔裤 衬衫 风衣 半身裙 T恤 卫衣 "
    "针织衫 毛衣 开衫 夹克 西装 马甲 裤子 短裤 打底裤 外套 大衣 羽绒服 棉服 冲锋衣 雪纺衫 Polo衫 背心 "
    "运动鞋 靴子 凉鞋 高跟鞋 拖鞋 袜子 围巾 帽子 手套 腰带 包 双肩包 红色 黑色 白色 蓝色 绿色 粉色 灰色 "
    "米色 棕色 黄色 紫色 纯棉 亚麻 真丝 羊毛 羊绒 皮革 夏季 冬季 春秋 宽松 修身 长袖 短袖 无袖 休闲 正装 "
    "运动 户外 新款 特价 包邮 官方 旗舰店 品牌 正品 大码 小个子 韩版 潮流 学生 百搭 显瘦 加厚 薄款 "
    "类别 标签 查询 商品 性别 人群 请 判断 以下 属于 哪个 只 输出 答案"
)


def _tiny_corpus() -> list[str]:
    # Words with and without a leading space (the two forms BPE sees after the
    # split regex), plus a few query-like lines; repeated with different
    # weights so merge counts are mostly distinct rather than tie-broken.
    words = _EN_WORDS.split() + _ZH_WORDS.split()
    lines: list[str] = []
    for i, w in enumerate(words):
        lines.extend([f" {w}"] * (1 + i % 5))
        lines.append(w)
    lines.extend(" ".join(words[i : i + 8]) for i in range(0, len(words), 3))
    lines.append("<|im_start|>system\nYou are a classifier.<|im_end|>\n<|im_start|>user\n")
    lines.append("0123456789 10 20 50 100 2024 S M L XL XXL 36 38 40 42 , . : ; ! ? ( ) - / \n\n")
    return lines


_TINY_SPECIALS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


@lru_cache(maxsize=1)
def _tiny_tokenizer_json(vocab_size: int = 1000) -> str:
    backend = Tokenizer(BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(_TINY_SPECIALS),
        min_frequency=1,
        show_progress=False,
        special_tokens=[],
        # All 256 byte symbols, so any text is encodable (no unk), as in Qwen.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(_tiny_corpus(), trainer=trainer)
    # Specials after the BPE vocab, mirroring Qwen's id layout.
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in _TINY_SPECIALS])
    return backend.to_str()


def tiny_byte_tokenizer() -> PreTrainedTokenizerFast:
    """~1000-token byte-level BPE with Qwen's regex and ChatML specials.

    eos = <|im_end|>, pad = <|endoftext|>, no BOS. Returns a fresh object each
    call (cheap: the trained tokenizer.json is cached) so callers may mutate it.
    """
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tiny_tokenizer_json()),
        bos_token=None,
        unk_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=["<|im_start|>"],
        clean_up_tokenization_spaces=False,
        model_max_length=512,
    )
