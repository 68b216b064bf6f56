"""GPU memory: an estimate from the model config alone (before any weight is read) and the budget check that
refuses a start that will not fit (what the device holds once loaded: device_memory.py).

The estimate follows what the engine allocates: weights placed by the backend, the decoder's K/V buffer
(prefix pool + the largest bucket's tokens), the largest bucket's activations (what its CUDA graph pool
holds), and the CUDA context, which lives outside torch's allocator.
Token counts are bounded from the prompt texts without a tokenizer (≈3 UTF-8 bytes per token: above
English BPE's ~4 characters per token and CJK's ~1–1.5 characters of 3 bytes each).
"""
from __future__ import annotations

import dataclasses

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from qcls.config import QclsConfig
from qcls.errors import QclsError

GIB = 1 << 30
CUDA_CONTEXT = int(0.45 * GIB)  # context + cuBLAS workspaces + kernel images; not in memory_allocated()
FRAGMENTATION = 0.01  # caching-allocator rounding on top of the weights (big tensors: whole 2 MiB pages)
ACT_SLACK = 1.2  # block rounding of the graph pool
PCIE_BYTES_PER_S = 12e9  # host→device over PCIe 3.0 x16 as a T4 host sees it, pinned memory


class MemoryBudgetError(QclsError, RuntimeError):
    """The chosen model + backend will not fit the GPU budget; the message names a backend that would."""


@dataclass(frozen=True)
class ParamCounts:
    layers: int
    embed: int  # vocab × hidden
    head: int  # 0 when tied to the embedding
    layer_linear: int  # per layer: q/k/v/o + gate/up/down weights
    layer_other: int  # per layer: norms and biases
    layer_out_rows: int  # per layer: sum of linear output features (per-row scales of int8)
    final_norm: int
    largest_linear: int  # elements of the largest single weight (dequantised on the fly by nf4/GPTQ-torch)
    hidden: int
    kv_heads: int
    head_dim: int
    vocab: int


def param_counts(mc: Any) -> ParamCounts:
    """Parameter counts of a Llama / Qwen2 / Qwen3 / Gemma3 decoder from its HF config."""
    h, inter, n_layers = mc.hidden_size, mc.intermediate_size, mc.num_hidden_layers
    nh, nkv = mc.num_attention_heads, mc.num_key_value_heads
    d = getattr(mc, "head_dim", None) or h // nh
    q, kv = nh * d, nkv * d
    linear = h * q + 2 * h * kv + q * h + 3 * h * inter
    kind = getattr(mc, "model_type", "")
    other = 4 * h if kind == "gemma3_text" else 2 * h  # Gemma3: norms before and after attention and MLP
    if kind in ("qwen3", "gemma3_text"):
        other += 2 * d  # q_norm, k_norm
    if getattr(mc, "model_type", "") == "qwen2" or getattr(mc, "attention_bias", False):
        other += q + 2 * kv
    tied = bool(getattr(mc, "tie_word_embeddings", False))
    return ParamCounts(n_layers, mc.vocab_size * h, 0 if tied else mc.vocab_size * h, linear, other,
                       q + 2 * kv + h + 2 * inter + h, h, max(h * inter, h * q), h, nkv, d, mc.vocab_size)


def _text_tokens(text: str) -> int:
    return max(1, -(-len(text.encode("utf-8")) // 3))


@dataclass(frozen=True)
class TokenPlan:
    pool: int  # prefix-pool slots (every prefix, block-rounded, no sharing assumed)
    forward: int  # tokens of the largest bucket's packed forward
    reads: int  # hidden states read in that forward


def token_plan(cfg: QclsConfig) -> TokenPlan:
    """Upper bounds on the engine's token counts, from the prompt texts alone. The largest bucket holds
    max_batch_size queries of the largest query bucket under every prompt, each followed by that prompt's
    suffix and label-trie tokens."""
    block = cfg.engine.prefix_block_size
    pool = sum(-(-_text_tokens(p.prefix) // block) * block for p in cfg.prompts)
    pool += -pool % 8
    const = sum(_text_tokens(p.suffix) + sum(_text_tokens(p.label_prefix + lab) for lab in p.labels)
                for p in cfg.prompts)
    b = cfg.engine.max_batch_size
    reads = sum(1 + len(p.labels) for p in cfg.prompts)
    return TokenPlan(pool, b * (len(cfg.prompts) * cfg.engine.query_buckets[-1] + const), b * reads)


@dataclass
class MemoryEstimate:
    """Bytes. `total` is what the GPU must hold; `weights_cpu` is host memory (pinned where it streams)."""
    backend: str
    weights_gpu: int
    weights_cpu: int
    kv_buffer: int
    activations: int  # largest bucket's forward, mask and tail (what the shared CUDA graph pool holds)
    cuda_context: int
    n_layers: int
    layers_on_gpu: int  # fp16-offload streams the others from the CPU on every request
    tokens: int  # tokens in the largest packed forward
    budget: int | None = None
    model_config: Any = field(default=None, repr=False, compare=False)
    layers_total: int = 0  # the model's decoder layers (n_layers is fewer when the forward stops at a head's layer)

    @property
    def total(self) -> int:
        return self.weights_gpu + self.kv_buffer + self.activations + self.cuda_context

    @property
    def streamed_bytes(self) -> int:
        """Layer weights copied host→device on every forward (0 unless layers are offloaded)."""
        if self.layers_on_gpu >= self.n_layers or self.model_config is None:
            return 0
        pc = param_counts(self.model_config)
        return (self.n_layers - self.layers_on_gpu) * (pc.layer_linear + pc.layer_other) * 2

    def streaming(self) -> str:
        """What offloaded layers cost per request ('' when every layer is on the GPU)."""
        if self.layers_on_gpu >= self.n_layers:
            return ""
        gb = self.streamed_bytes / 1e9
        return (f"{self.n_layers - self.layers_on_gpu} of {self.n_layers} layers streamed from the CPU per "
                f"request: ~{gb:.1f} GB, ~{gb / (PCIE_BYTES_PER_S / 1e9) * 1e3:.0f} ms at PCIe ~12 GB/s")

    def summary(self) -> str:
        g = lambda b: f"{b / GIB:.2f}"  # noqa: E731
        s = (f"{g(self.total)} GiB = weights {g(self.weights_gpu)} + KV buffer {g(self.kv_buffer)} + "
             f"activations/graph pool {g(self.activations)} + CUDA context {g(self.cuda_context)}")
        if self.layers_on_gpu < self.n_layers:
            s += f" ({self.layers_on_gpu}/{self.n_layers} decoder layers on the GPU)"
        if self.n_layers < self.layers_total:
            s += f" (the first {self.n_layers} of {self.layers_total} decoder layers: the forward stops at a head's layer)"
        return s

    def as_dict(self) -> dict[str, int]:
        return {"estimate_total": self.total, "estimate_weights_gpu": self.weights_gpu,
                "estimate_weights_cpu": self.weights_cpu, "estimate_kv_buffer": self.kv_buffer,
                "estimate_activations": self.activations}


def budget_bytes(cfg: QclsConfig, device: torch.device | None = None) -> int | None:
    """cfg.gpu_memory_gib, else the card's total memory, else None (no GPU: nothing to check)."""
    if cfg.gpu_memory_gib is not None:
        return int(cfg.gpu_memory_gib * GIB)
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(device if device is not None else 0).total_memory
    return None


def _quant_bits(mc: Any, opts: dict) -> tuple[int, int]:
    q = getattr(mc, "quantization_config", None) or {}
    q = q if isinstance(q, dict) else q.to_dict()
    bits = int(opts.get("bits") or q.get("bits") or q.get("w_bit") or 4)
    group = int(q.get("group_size") or q.get("q_group_size") or 128)
    return bits, (group if group > 0 else 1 << 30)


def _options(cfg: QclsConfig, backend: str) -> dict:
    return dict(cfg.backend.options) if backend == cfg.backend.name else {}


def estimate(cfg: QclsConfig, model_config: Any, backend: str | None = None,
             budget: int | None = None, layers: int | None = None) -> MemoryEstimate:
    """GPU memory that `backend` (default: cfg's) needs for this model and engine, from the config alone.
    `layers`: only the first this many decoder layers are loaded, and no untied LM head (the forward stops at a
    head's layer)."""
    backend = backend or cfg.backend.name
    opts = _options(cfg, backend)
    if backend == "auto":  # an estimate is of GPU memory, and on a GPU auto runs fp16
        backend, opts = "fp16", {}
    budget = budget if budget is not None else budget_bytes(cfg)
    pc = param_counts(model_config)
    if layers is not None and layers < pc.layers:
        pc = dataclasses.replace(pc, layers=layers, head=0)
    b = 4 if cfg.backend.dtype == "float32" else 2
    tp = token_plan(cfg)
    n, key_len = tp.forward, tp.pool + tp.forward + 16
    nh_d = model_config.num_attention_heads * pc.head_dim
    kv_d = pc.kv_heads * pc.head_dim
    act_per_token = (4 * pc.hidden + 2 * nh_d + 4 * kv_d + 3 * model_config.intermediate_size) * b
    act = n * act_per_token + n * key_len * (1 + 1 + b + b)  # masks: allowed, key_ok, additive, where()
    act += tp.reads * (pc.hidden + 64) * b
    if cfg.strategy in ("exact", "mean_logprob"):
        act += 2 * tp.reads * min(cfg.scoring.vocab_chunk, pc.vocab) * 4
    act = int(act * ACT_SLACK)
    kv = pc.layers * 2 * kv_d * key_len * b
    if cfg.engine.kind == "reference":
        seq = max(_text_tokens(p.prefix + p.suffix) for p in cfg.prompts) + cfg.max_query_tokens + 16
        kv, act = pc.layers * 2 * kv_d * seq * b, seq * (act_per_token + pc.vocab * 4)

    layer = (pc.layer_linear + pc.layer_other) * b
    table = pc.embed * b  # the embedding; the head is the same size when untied
    head = pc.head * b
    rest = pc.final_norm * b
    cpu = 0
    on_gpu = pc.layers
    if backend == "fp16":
        gpu = table + head + pc.layers * layer + rest
    elif backend == "fp16-offload":
        label_rows = sum(len(p.labels) + 1 for p in cfg.prompts) * pc.hidden * b
        full = bool(opts.get("full_head", False))
        fixed = rest + (pc.vocab * pc.hidden * b if full else label_rows)
        cpu = table + head
        mode = str(opts.get("offload_layers", "auto")).lower()
        fits_all = fixed + pc.layers * layer * (1 + FRAGMENTATION) + kv + act + CUDA_CONTEXT
        if mode in ("true", "1") or (mode == "auto" and budget is not None and fits_all > budget):
            if opts.get("gpu_layers") is not None:
                on_gpu = int(opts["gpu_layers"])
            elif budget is not None:
                room = budget - (fixed + kv + act + CUDA_CONTEXT + pc.largest_linear * b)
                on_gpu = max(0, min(pc.layers, math.floor(room / (layer * (1 + FRAGMENTATION)))))
            else:
                on_gpu = 0
            act += pc.largest_linear * b  # one offloaded module's weights in flight at a time
        gpu = fixed + on_gpu * layer
        cpu += (pc.layers - on_gpu) * layer
    elif backend in ("int8", "bnb-int8", "bnb-nf4", "gptq"):
        lin = pc.layers * pc.layer_linear
        if backend == "int8":  # int8 + fp32 channel scales + 4 smoothing vectors; one fp16 layer in flight at load
            qbytes = lin + pc.layers * (pc.layer_out_rows * 4 + 4 * model_config.intermediate_size * 4)
            act += pc.layer_linear * b
        elif backend == "bnb-int8":
            qbytes = lin + pc.layers * pc.layer_out_rows * 4  # int8 + fp32 row scales
        elif backend == "bnb-nf4":
            qbytes = lin // 2 + lin // 64 * (1 if opts.get("double_quant") else 4)  # 4-bit + absmax per 64
            act += pc.largest_linear * b  # a weight is dequantised to fp16 for multi-token matmuls
        else:
            bits, group = _quant_bits(model_config, opts)
            qbytes = lin * bits // 8 + lin // group * (b + bits / 8) + pc.layers * 4 * pc.hidden * 4
            act += pc.largest_linear * b
        gpu = int(qbytes) + pc.layers * pc.layer_other * b + table + head + rest
    else:
        raise ValueError(f"no memory model for backend {backend!r}")
    weights = int(gpu * (1 + FRAGMENTATION))
    return MemoryEstimate(backend, weights, int(cpu), int(kv), int(act), CUDA_CONTEXT, pc.layers, on_gpu,
                          n, budget, model_config, layers_total=model_config.num_hidden_layers)


def applies(backend: str, model_config: Any) -> bool:
    """Whether `backend` can load this checkpoint: a pre-quantized (GPTQ/AWQ) one needs backend=gptq, and
    backend=gptq needs one."""
    quantized = getattr(model_config, "quantization_config", None) is not None
    return (backend == "gptq") == quantized


def _alternatives(cfg: QclsConfig, est: MemoryEstimate, budget: int) -> list[str]:
    from qcls.backends.registry import BACKENDS
    quantized = getattr(est.model_config, "quantization_config", None) is not None
    whole, partial = [], []
    for name in BACKENDS:
        if name == est.backend or not applies(name, est.model_config):
            continue
        try:
            e = estimate(cfg, est.model_config, backend=name, budget=budget,
                         layers=est.n_layers if est.n_layers < est.layers_total else None)
        except ValueError:
            continue
        if e.total > budget:
            continue
        if e.layers_on_gpu < e.n_layers:
            partial.append(f"backend={name} ({e.total / GIB:.1f} GiB, but {e.streaming()})")
        else:
            whole.append(f"backend={name} ({e.total / GIB:.1f} GiB)")
    if not quantized and est.backend != "gptq":
        whole.append("backend=gptq with a GPTQ/AWQ checkpoint")
    return whole + partial


def check_budget(cfg: QclsConfig, est: MemoryEstimate, device: torch.device | None = None) -> None:
    """Raise MemoryBudgetError when the estimate exceeds the budget, naming both and what would fit."""
    budget = est.budget if est.budget is not None else budget_bytes(cfg, device)
    if budget is None or est.total <= budget:
        return
    src = "gpu_memory_gib" if cfg.gpu_memory_gib is not None else "the card's total memory"
    alts = _alternatives(cfg, est, budget) if est.model_config is not None else []
    hint = ("backends that fit: " + ", ".join(alts)) if alts else \
        "no registered backend fits: lower engine.max_batch_size / engine.query_buckets or use a smaller model"
    raise MemoryBudgetError(
        f"{cfg.model.name} with backend={est.backend} needs an estimated {est.summary()}, over the budget of "
        f"{budget / GIB:.2f} GiB ({src})", hint + "; `qcls check` prints every backend's estimate")
