"""fp16-offload: fp16 quality for models that do not fit the GPU whole.

The request path reads the decoder layers, a few embedding rows and a few LM-head rows. So only the layers
(+ final norm and rotary tables) go to the GPU; the embedding table stays in pinned CPU memory and the
engine's `embed_fn` gathers the request's rows there and copies them into the static input buffer outside
the CUDA graph; the LM head stays on the CPU and `head_rows` copies only the label rows the tail multiplies
by (the GPU never holds the [V, H] head). Qwen3-8B: 13.9 GB of layers instead of 16.4 GB.

Full-vocabulary strategies (exact, mean_logprob) need the whole head on the GPU: refused at start-up unless
`backend.options.full_head=true`, which puts it there (+1.2 GB for Qwen3-8B: no longer fits a T4, fine for
a 4B-class model).

When even the layers do not fit (`offload_layers: auto` and the estimate over budget, or `true`), the linear
weights of the layers that do not fit stay in pinned CPU memory and accelerate's hooks copy each one to the
GPU when it runs, on every request: slow, host-driven (no CUDA graphs), and said so at start-up.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from qcls.backends import sources
from qcls.backends.base import Backend, LoadedModel, backend_options, resolve_device, resolve_dtype
from qcls.backends.memory import PCIE_BYTES_PER_S
from qcls.config import QclsConfig
from qcls.engine.family import embed_scale

DEFAULTS = {"offload_layers": "auto", "gpu_layers": None, "full_head": False}
VOCAB_STRATEGIES = ("exact", "mean_logprob")


@dataclass
class OffloadedModel(LoadedModel):
    keep_full_head: bool = False

    def full_head(self) -> torch.Tensor | None:
        # The head lives on the CPU unless full_head=true moved it; never hand out a CPU table, even when
        # the "device" is the CPU (tests), so the refusal is the same everywhere.
        return super().full_head() if self.keep_full_head else None


class EmbedGather:
    """embed_fn for the engine: rows of the CPU table for `ids`, copied into `out` on the device, times the
    embedding module's own scale where it has one (Gemma3: √hidden, applied in the table's dtype as the
    module applies it), so `out` is what the module would return.

    One pinned staging buffer is reused; an event keeps the next gather from overwriting it while the
    previous asynchronous copy may still be reading it."""

    def __init__(self, table: torch.Tensor, device: torch.device, scale: torch.Tensor | None = None):
        self.table, self.device = table, device
        self.scale = None if scale is None else scale.detach().to("cpu", table.dtype)
        self.staging: torch.Tensor | None = None
        self.copied = torch.cuda.Event() if device.type == "cuda" else None

    def __call__(self, ids: torch.Tensor, out: torch.Tensor) -> None:
        ids = ids.reshape(-1).to("cpu", torch.long)
        if self.copied is None:
            rows = self.table.index_select(0, ids)
            out.copy_(rows if self.scale is None else rows * self.scale)
            return
        n = ids.numel()
        if self.staging is None or self.staging.shape[0] < n:
            self.copied.synchronize()
            self.staging = torch.empty(max(n, 1024), self.table.shape[1], dtype=self.table.dtype, pin_memory=True)
        self.copied.synchronize()
        torch.index_select(self.table, 0, ids, out=self.staging[:n])
        if self.scale is not None:
            self.staging[:n].mul_(self.scale)
        out.copy_(self.staging[:n], non_blocking=True)
        self.copied.record()


def _mode(value) -> str:
    mode = str(value).lower()
    if mode not in ("auto", "true", "false"):
        raise ValueError(f"backend fp16-offload: offload_layers must be auto, true or false, got {value!r}")
    return mode


class StreamedLinear(torch.nn.Linear):
    """A linear whose weights stay in (pinned) CPU memory; accelerate's hook copies them to the device for
    each call. Its own class keeps the engine from fusing it with its neighbours (the engine fuses plain
    nn.Linear weights into one GEMM and would read the placeholder)."""


def _offload_layer(layer: torch.nn.Module, device: torch.device, pin: bool) -> int:
    """Keep `layer`'s linear weights on the CPU behind accelerate's AlignDevicesHook (weights in before the
    module runs, placeholder after); its norms are a few KB and move to `device`, since the engine reads
    them directly. Returns the bytes streamed per forward."""
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module
    streamed = 0
    for mod in list(layer.modules()):
        if type(mod) is torch.nn.Linear:
            sd = {k: (v.pin_memory() if pin else v) for k, v in mod.state_dict().items()}
            streamed += sum(v.numel() * v.element_size() for v in sd.values())
            mod.__class__ = StreamedLinear
            add_hook_to_module(mod, AlignDevicesHook(execution_device=device, offload=True, weights_map=sd))
            continue
        for name, p in list(mod.named_parameters(recurse=False)):
            mod._parameters[name] = torch.nn.Parameter(p.data.to(device), requires_grad=False)
        for name, b in list(mod.named_buffers(recurse=False)):
            mod._buffers[name] = b.to(device)
    return streamed


def placement_bytes(model: torch.nn.Module, extra_cpu: int = 0) -> dict[str, int]:
    """Bytes on the GPU and on the CPU (meta placeholders of offloaded modules are not memory)."""
    out = {"weights_gpu": 0, "weights_cpu": extra_cpu}
    seen: set[int] = set()
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) in seen or t.device.type == "meta":
            continue
        seen.add(id(t))
        out["weights_gpu" if t.device.type == "cuda" else "weights_cpu"] += t.numel() * t.element_size()
    return out


def _hooks_for_reference(model: torch.nn.Module, device: torch.device) -> None:
    """The fast engine never calls the embedding or the head modules; the reference engine runs the plain
    transformers forward, which needs the tensors moved across the CPU/GPU boundary."""
    model.get_input_embeddings().register_forward_hook(lambda m, i, o: o.to(device))
    head = model.get_output_embeddings()
    head.register_forward_pre_hook(lambda m, args: tuple(a.to(m.weight.device) for a in args))


class Fp16OffloadBackend(Backend):
    name = "fp16-offload"

    def load(self, cfg: QclsConfig, layers: int | None = None, tokenizer=None) -> LoadedModel:
        device = resolve_device(cfg)
        dtype = resolve_dtype(cfg, device)
        opts = backend_options(cfg, DEFAULTS)
        mode = _mode(opts["offload_layers"])
        full_head = bool(opts["full_head"])
        if cfg.strategy in VOCAB_STRATEGIES and not full_head:
            raise ValueError(
                f"scoring={cfg.strategy} needs the full-vocabulary LM head on the GPU, and backend fp16-offload "
                "keeps only the label rows there; use scoring=trie (the default) or first_token, or keep the "
                "whole head on the GPU with backend.options.full_head=true (+vocab × hidden × 2 bytes: "
                "1.2 GB for Qwen3-8B), or use backend=fp16, bnb-int8 or bnb-nf4")
        src = self.source(cfg)
        est = self.preflight(cfg, src, device, layers)
        tokenizer = sources.load_tokenizer(src) if tokenizer is None else tokenizer
        model = sources.load_model(src, dtype, layers)  # on the CPU; only what the request path reads moves
        base, n_layers = model.model, len(model.model.layers)
        if est is not None:
            on_gpu = est.layers_on_gpu
        elif mode == "true":
            on_gpu = int(opts["gpu_layers"]) if opts["gpu_layers"] is not None else 0
        else:
            on_gpu = n_layers
        on_gpu = max(0, min(n_layers, on_gpu))
        pin = device.type == "cuda"

        for name, child in base.named_children():
            if name not in ("embed_tokens", "layers"):
                child.to(device)  # final norm, rotary tables
        streamed = 0
        for i, layer in enumerate(base.layers):
            if i < on_gpu:
                layer.to(device)
            else:
                streamed += _offload_layer(layer, device, pin)
        embed = base.embed_tokens
        head = model.get_output_embeddings()
        tied = head.weight is embed.weight
        if pin:
            embed.weight.data = embed.weight.data.pin_memory()  # a tied head shares the same Parameter
        if full_head:
            if tied:  # keep the table on the CPU for the gather, a copy on the GPU for the normaliser
                head.weight = torch.nn.Parameter(embed.weight.detach().to(device), requires_grad=False)
            else:
                head.to(device)
        _hooks_for_reference(model, device)

        notes: list[str] = []
        if on_gpu < n_layers:
            gb = streamed / 1e9
            notes.append(
                f"fp16-offload: {n_layers - on_gpu} of {n_layers} decoder layers are kept in "
                f"{'pinned ' if pin else ''}CPU memory and copied to the GPU by accelerate on every request: "
                f"~{gb:.2f} GB per request, ~{streamed / PCIE_BYTES_PER_S * 1e3:.0f} ms at PCIe ~12 GB/s; "
                "CUDA graphs are off (the copies are driven from the host). A quantized backend (bnb-int8, "
                "bnb-nf4, gptq) keeps every layer on the GPU")
        memory = placement_bytes(model, extra_cpu=streamed)
        memory["weights_streamed_per_request"] = streamed
        memory["head_on_gpu"] = int(full_head)
        if est is not None:
            memory.update(est.as_dict())
        loaded = OffloadedModel(model, tokenizer, device, dtype, self.name, graph_capturable=on_gpu == n_layers,
                                notes=notes, memory=memory,
                                embed_fn=EmbedGather(embed.weight.data, device, embed_scale(embed)),
                                keep_full_head=full_head)
        return loaded

