"""int8: W8A8 decoder linears on the int8 GEMM (cuBLASLt on sm_75+, oneDNN/VNNI on the CPU).

Weights are int8 with one scale per output channel, quantized while loading, layer by layer on the device
(qcls/backends/int8_calibration.py), from every source the fp16 backend reads. Activations are quantized per token
at run time by the kernels that produce them (the norms, the gated activation). Embeddings, norms, the LM head's
label rows and the heads stay in floating point; so do the linears whose int8 error on the calibration text exceeds
`max_error` (named at start-up). The engine joins q/k/v and gate/up into one int8 GEMM each, as it does in fp16.
"""
from __future__ import annotations

import torch

from qcls.backends import int8_cache
from qcls.backends import int8_calibration as cal
from qcls.backends import sources
from qcls.backends.base import Backend, LoadedModel, backend_options, module_bytes, resolve_device, resolve_dtype
from qcls.config import QclsConfig
from qcls.engine.int8_linear import cpu_gemm, shapes_ok
from qcls.errors import ConfigError, DeviceError
from qcls.progress import step_note

WAY_OUT = "use backend=fp16"
DEFAULTS = {
    "calibration_queries": None,  # a query file (.csv/.tsv `query` column, .jsonl, .txt, .parquet); None: built-in
    "calibration_tokens": 4096,  # tokens of calibration text (prompts around queries) the layers are run over
    "alphas": [0.0, 0.25, 0.5, 0.75],  # smoothing strengths tried per group of linears (0: none)
    "max_error": 0.1,  # a group whose relative output error stays above this keeps floating-point weights
    "cache": True,  # keep the calibrated weights in cache_dir/int8 and read them at the next such start
}


def check_device(device: torch.device) -> None:
    """The int8 tensor cores came with Turing (sm_75): older GPUs are refused before any weight is read."""
    if device.type != "cuda":
        return
    cap = torch.cuda.get_device_capability(device)
    if cap < (7, 5):
        raise DeviceError(f"backend int8 needs int8 tensor cores (compute capability 7.5, Turing, or later); "
                          f"this GPU is sm_{cap[0]}{cap[1]}", WAY_OUT)


def check_shapes(model_config) -> None:
    """cuBLASLt's int8 GEMM takes in/out features that are multiples of 8: refused from the config alone."""
    h, inter = model_config.hidden_size, model_config.intermediate_size
    d = getattr(model_config, "head_dim", None) or h // model_config.num_attention_heads
    dims = {"hidden_size": h, "intermediate_size": inter, "heads × head_dim": model_config.num_attention_heads * d,
            "kv heads × head_dim": model_config.num_key_value_heads * d}
    bad = {k: v for k, v in dims.items() if not shapes_ok(v, 8)}
    if bad:
        raise ConfigError(f"backend int8: the int8 GEMM needs every linear's features to be multiples of 8; this "
                          f"model has {bad}", WAY_OUT)


def options(cfg: QclsConfig) -> dict:
    opts = backend_options(cfg, DEFAULTS)
    alphas = [float(a) for a in opts["alphas"]]
    if not alphas or any(not 0.0 <= a <= 1.0 for a in alphas):
        raise ConfigError(f"backend int8: alphas must be values in [0, 1], got {opts['alphas']}",
                          "e.g. backend.options.alphas=[0,0.5]")
    if float(opts["max_error"]) <= 0:
        raise ConfigError(f"backend int8: max_error must be > 0, got {opts['max_error']}",
                          "e.g. backend.options.max_error=0.1 (larger: more linears in int8)")
    if int(opts["calibration_tokens"]) < 64:
        raise ConfigError(f"backend int8: calibration_tokens must be at least 64, got {opts['calibration_tokens']}",
                          "e.g. backend.options.calibration_tokens=4096")
    if not isinstance(opts["cache"], bool):
        raise ConfigError(f"backend int8: cache must be true or false, got {opts['cache']!r}",
                          "backend.options.cache=false calibrates at every start and writes nothing")
    return {**opts, "alphas": alphas}


class Int8Backend(Backend):
    name = "int8"

    def load(self, cfg: QclsConfig, layers: int | None = None, tokenizer=None) -> LoadedModel:
        device = resolve_device(cfg)
        dtype = resolve_dtype(cfg, device)
        opts = options(cfg)
        check_device(device)
        src = self.source(cfg)
        check_shapes(sources.load_config(src))
        est = self.preflight(cfg, src, device, layers)
        queries = (cal.read_queries(opts["calibration_queries"]) if opts["calibration_queries"]
                   else cal.BUILT_IN_QUERIES)  # a bad file is refused before the weights are read
        tokenizer = sources.load_tokenizer(src) if tokenizer is None else tokenizer
        model = sources.load_model(src, dtype, layers)  # on the CPU; each layer moves once it is its turn
        ids, mask = cal.calibration_batch(cfg, tokenizer, queries, int(opts["calibration_tokens"]))
        report, where, notes = quantize(cfg, model, ids, mask, device, dtype, opts)
        if opts["calibration_queries"]:  # the file named now (a cached calibration of its queries may name another)
            report.source = f"the queries of {opts['calibration_queries']}"
        model.to(device)  # what is still on the CPU: nothing but placeholders, normally
        total = sum(len(g) for g in cal.GROUPS) * len(model.model.layers)
        memory = module_bytes(model)
        if est is not None:
            memory.update(est.as_dict())
        kernel, why = cpu_gemm() if device.type == "cpu" else ("", "")
        if kernel == "int_mm":  # the slower kernel: said, not silent
            notes.append(f"int8 GEMM on the CPU through torch._int_mm, slower than oneDNN's packed kernel: {why}")
        return LoadedModel(model, tokenizer, device, dtype, self.name, memory=memory, notes=notes,
                           info=[report.line(total, float(opts["max_error"])) + where])


def quantize(cfg: QclsConfig, model, ids, mask, device, dtype, opts) -> tuple[cal.Int8Report, str, list[str]]:
    """The model's decoder linears in W8A8: read from the cache where this calibration was done before, otherwise
    calibrated (and saved). Returns the report, where the weights came from or went, and warnings."""
    def calibrate() -> cal.Int8Report:
        kept = "kept for later starts with these prompts" if opts["cache"] else "backend.options.cache=false"
        step_note(f"int8: calibrating the decoder linears on {ids.shape[0]} rows of the prompts' text ({kept}; "
                  f"backend=fp16 starts without it, in float32 on a CPU)")
        return cal.quantize_model(model, ids, mask, device, opts["alphas"], float(opts["max_error"]))

    if not opts["cache"]:
        return calibrate(), "", []
    path = int8_cache.path_for(sources.cache_root(cfg.cache_dir), int8_cache.weights_key(model),
                               int8_cache.calibration_key(ids, mask, opts, dtype, device))
    notes = []
    try:
        report = int8_cache.read(path, model, dtype)
        if report is not None:
            return report, f"; read from {path}", notes
    except Exception as e:  # a damaged or foreign file costs a calibration, said here, never a failed start
        notes.append(f"int8: {path} could not be read ({type(e).__name__}: {e}); calibrated again")
    report = calibrate()
    try:
        int8_cache.write(path, model, report)
    except Exception as e:  # a full disk, a read-only folder: the next start calibrates again, as said here
        notes.append(f"int8: the calibrated weights could not be saved to {path} ({e}); the next start "
                     f"calibrates again (backend.options.cache=false stops trying)")
        return report, "", notes
    return report, f"; saved to {path} for the next start", notes
