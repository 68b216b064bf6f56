"""Quantizing a model's decoder linears to W8A8 layer by layer, calibrated on the prompts' own text.

The model runs one forward over the calibration sequences in its loaded dtype. Each decoder layer moves to the
compute device just before its turn; its linears' inputs are recorded on the way, and as soon as the layer has run,
its linears are replaced by Int8Linear ones and its floating-point weights dropped. So the floating-point model
never sits on the device whole (one layer at a time does), and each layer is calibrated on the activations the
floating-point layers before it produce.

Per group of linears that read one input (q/k/v; o; gate/up; down), SmoothQuant's smoothing
s_j = max|X_j|^α / max|W_j|^(1−α) moves outlier channels of the input into the weights; α is chosen per group
from `alphas` by the output error on the calibration rows, ‖Y_int8 − Y‖ / ‖Y‖. A group whose error stays above
`max_error` keeps its floating-point weights (reported at start-up).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from qcls.engine.int8_kernels import quantize_rows_torch
from qcls.engine.int8_linear import Int8Linear, int_mm, quantize_weight
from qcls.errors import ConfigError
from qcls.query_files import Reader

# queries written into each prompt's template where the user gives no query file: varied in length, language and
# kind, so that the query positions' activations are seen too (the prompts' fixed text is most of every row)
BUILT_IN_QUERIES = [
    "mens slim fit jeans", "夏季女士碎花连衣裙", "red running shoes size 42", "kids winter jacket waterproof",
    "cheap wireless earbuds", "organic cotton baby bodysuit", "leather handbag women", "iphone 15 case",
    "男童运动鞋", "vestido largo de verano", "laptop backpack 15 inch", "gift for dad",
]
ERROR_CHUNK = 4096  # output channels per step of the error measurement (a float32 chunk of 4096 × 4096 is 64 MiB)
GROUPS = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",))


@dataclass
class Int8Report:
    """What the quantization did, for the start-up line and the result metadata."""
    tokens: int = 0
    int8: int = 0
    alphas: dict[float, int] = field(default_factory=dict)
    kept: list[str] = field(default_factory=list)  # "layer 3 down_proj (error 0.21)"
    worst: float = 0.0
    source: str = "the built-in queries"

    def line(self, total: int, max_error: float) -> str:
        alphas = ", ".join(f"α {a:g}: {n}" for a, n in sorted(self.alphas.items()))
        kept = (f"; kept in fp16 (output error over {max_error:g} on the calibration text): " + "; ".join(self.kept)
                if self.kept else "")
        return (f"int8: {self.int8} of {total} decoder linears in W8A8, calibrated on {self.tokens} tokens of the "
                f"prompts' text around {self.source} ({alphas}; largest output error {self.worst:.3f}){kept}")


FORMATS_WAY_OUT = ("give a .csv or .tsv with a `query` column, a .jsonl file of {\"query\": …} objects, a .txt "
                   "file of one query a line or a .parquet file (backend.options.calibration_queries=PATH), or "
                   "null for the built-in queries")


def read_queries(path: str) -> list[str]:
    """Every query of a query file, read as `qcls bulk` reads its input (qcls/query_files.py); any file or row it
    cannot read is refused, naming the option, the file and the line."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"backend int8: calibration_queries file {str(p)!r} does not exist", FORMATS_WAY_OUT)
    try:
        reader = Reader(p)  # the extension, NUL bytes, the header or first object: checked before any row
    except ConfigError as e:
        raise ConfigError(f"backend int8: calibration_queries: {e.what}", FORMATS_WAY_OUT) from None
    out = []
    for row in reader.rows():
        if row.error:  # undecodable bytes, a malformed record, a missing or non-text query
            raise ConfigError(f"backend int8: calibration_queries {str(p)!r} line {row.line}: {row.error}",
                              "mend or remove that line, or " + FORMATS_WAY_OUT)
        if row.query.strip():
            out.append(row.query.strip())
    if not out:
        raise ConfigError(f"backend int8: {str(p)!r} holds no query", "give a file with at least one query")
    return out


def calibration_batch(cfg, tokenizer, queries: list[str], max_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [B, T], mask [B, T]): each prompt's template around queries in turn, with one of its labels after it,
    until `max_tokens` tokens; right-padded."""
    seqs: list[list[int]] = []
    total, i = 0, 0
    while total < max_tokens and i < len(queries) * len(cfg.prompts):
        p = cfg.prompts[i % len(cfg.prompts)]
        q = queries[(i // len(cfg.prompts)) % len(queries)]
        label = p.labels[i % len(p.labels)]
        ids = tokenizer.encode(p.prefix + q + p.suffix + p.label_prefix + label, add_special_tokens=False)
        seqs.append(ids[:max_tokens - total])
        total += len(seqs[-1])
        i += 1
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, :len(s)] = torch.tensor(s)
        mask[r, :len(s)] = 1
    return ids, mask


@torch.inference_mode()
def quantize_model(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, device: torch.device,
                   alphas: list[float], max_error: float) -> Int8Report:
    """Replace every decoder linear of `model` (on the CPU) by an Int8Linear on `device`, layer by layer."""
    base = model.model
    for name, child in base.named_children():
        if name != "layers":
            child.to(device)
    for child in model.children():  # an untied LM head (a dropped one holds nothing)
        if child is not base and all(t.device.type != "meta" for t in child.parameters()):
            child.to(device)
    keep = mask.reshape(-1).bool().to(device)
    report = Int8Report(tokens=int(keep.sum()))
    inputs: dict[str, torch.Tensor] = {}

    def record(name):
        def hook(_mod, args):
            if name not in inputs:  # the modules of a group read one input: recorded once
                inputs[name] = args[0].reshape(-1, args[0].shape[-1])[keep].float()
        return hook

    def before(layer, _args, _kwargs):
        layer.to(device)
        layer._qcls_hooks = [getattr(parent_of(layer, g[0]), g[0]).register_forward_pre_hook(record(g[0]))
                             for g in GROUPS]

    def after(layer, _args, _kwargs, _out):
        for h in layer._qcls_hooks:
            h.remove()
        del layer._qcls_hooks
        for group in GROUPS:
            _quantize_group(layer, group, inputs.pop(group[0]), alphas, max_error, report, index[id(layer)])
        inputs.clear()

    index = {id(layer): i for i, layer in enumerate(base.layers)}
    handles = [h for layer in base.layers for h in (layer.register_forward_pre_hook(before, with_kwargs=True),
                                                    layer.register_forward_hook(after, with_kwargs=True))]
    try:
        base(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return report


def parent_of(layer: nn.Module, name: str) -> nn.Module:
    return layer.self_attn if name in ("q_proj", "k_proj", "v_proj", "o_proj") else layer.mlp


def _quantize_group(layer, names, x: torch.Tensor, alphas, max_error, report: Int8Report, index: int) -> None:
    parent = parent_of(layer, names[0])
    mods = [getattr(parent, n) for n in names]
    w = torch.cat([m.weight.detach() for m in mods])  # the model's dtype: a float32 copy is made a chunk at a time
    xmax = x.abs().amax(0).clamp_min(1e-5)
    wmax = w.abs().amax(0).float().clamp_min(1e-5)
    smooths = [None if a == 0 else (wmax.pow(1 - a) / xmax.pow(a)) for a in alphas]  # 1/s: what the input is × by
    errors = output_errors(x, w, smooths)
    err, i = min((e, i) for i, e in enumerate(errors))
    a, smooth = alphas[i], smooths[i]
    report.worst = max(report.worst, err)
    if err > max_error:
        report.kept.append(f"layer {index} {'/'.join(names)} ({err:.3f})")
        return
    report.alphas[a] = report.alphas.get(a, 0) + len(mods)
    report.int8 += len(mods)
    dtype = mods[0].weight.dtype
    for n, m in zip(names, mods):
        setattr(parent, n, Int8Linear.from_linear(m, smooth, dtype))


def output_errors(x: torch.Tensor, w: torch.Tensor, smooths: list, chunk: int = ERROR_CHUNK) -> list[float]:
    """Per smoothing vector, the W8A8 product's relative error on the calibration rows, ‖Y_int8 − Y‖ / ‖Y‖ with
    Y = x @ w^T, summed over chunks of `chunk` output channels: each channel's weight scale is its own, so the
    chunks are exact, and the float32 temporaries stay a chunk wide (a whole group's are GiBs for an 8B model,
    which a 16 GB card must hold beside the weights)."""
    xs = [quantize_rows_torch(x, m) for m in smooths]
    sq_err, sq_ref = [0.0] * len(smooths), 0.0
    for lo in range(0, w.shape[0], chunk):
        wc = w[lo:lo + chunk].float()
        ref = x @ wc.t()
        sq_ref += float(ref.square().sum())
        for j, (m, (qx, sx)) in enumerate(zip(smooths, xs)):
            qw, sw = quantize_weight(wc, m)
            y = int_mm(qx, qw).float().mul_(sx[:, None]).mul_(sw[None, :])
            sq_err[j] += float(y.sub_(ref).square().sum())
    return [(e / max(sq_ref, 1e-24)) ** 0.5 for e in sq_err]
