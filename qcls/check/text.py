"""`qcls check`'s report as text for people (`--json` prints `CheckReport.to_dict()` instead)."""
from __future__ import annotations

from qcls.check.report import BackendFit, CheckReport, PromptCheck
from qcls.heads.depth import Depth


def _prompt(p: PromptCheck) -> list[str]:
    shared = f", {p.shared_prefix_tokens} shared with other prompts" if p.shared_prefix_tokens else ""
    lines = [f"prompt {p.name}: prefix {p.prefix_tokens} tokens{shared}; suffix {p.suffix_tokens} tokens; "
             f"{p.row_trie_tokens} label-trie tokens per row"]
    if p.end_token is not None:
        lines.append(f"  labels that others extend end with the token {p.end_token!r}")
    width = max(len(lab.label) for lab in p.labels)
    lines.append(f"  {'label':<{width}}  tokens  trie scoring cost")
    for lab in p.labels:
        cost = "single-token (1 logit)" if lab.single_token_cost else f"{lab.trie_reads} logits"
        ext = f"; a token-prefix of {', '.join(lab.extended_by)}" if lab.extended_by else ""
        lines.append(f"  {lab.label:<{width}}  {lab.tokens:>6}  {cost}{ext}")
    return lines


def _fits(b: BackendFit) -> str:
    if b.fits is None:
        return "no budget"
    return "fits" if b.fits else "does NOT fit"


def format_report(rep: CheckReport) -> str:
    mc = rep.model_config
    out = [f"model {rep.model} ({rep.source}): {mc['model_type']}, {mc['num_hidden_layers']} layers, hidden "
           f"{mc['hidden_size']}, vocab {mc['vocab_size']}" + (f", {mc['quantization']}" if mc["quantization"] else ""),
           f"strategy {rep.strategy}, engine {rep.engine}, backend {rep.backend}", ""]
    for p in rep.prompts:
        out += _prompt(p) + [""]
    if rep.forward:
        q = rep.forward[0].query_tokens
        per = "; ".join(f"batch {f.batch}: {f.tokens}" + (f" (bucket of {f.bucket_tokens})" if f.bucket_tokens else
                                                          " (over the largest bucket)") for f in rep.forward)
        out += [f"tokens per forward at {q} query tokens each: {per}; prefix pool {rep.prefix_pool_tokens} tokens "
                "(computed once at start-up)", ""]
    if rep.head:
        reads = "; ".join(f"{n}: {r}" for n, r in rep.head["prompts"].items())
        out += [rep.head["line"]]
        if reads:
            out += [f"  reads ({rep.head['method']}): {reads}"
                    + ("; fitted on these weights? checked at start-up" if rep.head["weights_checked_at_start_up"]
                       else "")]
        out += [*[f"  note: {n}" for n in rep.head["notes"]], ""]
    if rep.depth:
        d = rep.depth
        out += [Depth(d["layers"], d["of"], d["why"], d["loaded"]).line(), ""]
    budget = f"{rep.budget_gib:.2f} GiB" if rep.budget_gib is not None else \
        "none (no GPU here: set gpu=t4 or gpu_memory_gib=N)"
    out.append(f"GPU memory estimate per backend (from the model config; budget {budget}):")
    out.append(f"  {'backend':<13} {'total':>7} {'weights':>8} {'cpu':>6} {'kv':>6} {'act':>6}  verdict")
    for b in rep.backends:
        if not b.n_layers:  # no estimate
            out.append(f"  {b.backend:<13} {'-':>7}  {b.note}")
            continue
        verdict = _fits(b) + ("" if b.applies else " (n/a)")
        note = f"  [{b.note}]" if b.note else ""
        out.append(f"  {b.backend:<13} {b.total_gib:>7.2f} {b.weights_gpu_gib:>8.2f} {b.weights_cpu_gib:>6.2f} "
                   f"{b.kv_buffer_gib:>6.2f} {b.activations_gib:>6.2f}  {verdict}{note}")
    out.append("  (GiB: total on the GPU = weights + KV buffer + activations + CUDA context; cpu = host memory)")
    out.append("")
    out.append("ok: this configuration can start" if not rep.problems else
               f"{len(rep.problems)} problem(s): see the error below")
    return "\n".join(out) + "\n"
