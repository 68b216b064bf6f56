"""The facts `qcls check` reports, computed with the code start-up runs: canonical tokenization and the label
trie (qcls/scoring/), the prefix-block plan and the packer's token arithmetic (qcls/engine/), and every
registered backend's memory estimate (qcls/backends/memory.py). Reads the model's config and tokenizer only.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from qcls.backends import memory, sources
from qcls.backends.registry import AUTO, BACKENDS
from qcls.config import QclsConfig
from qcls.heads.depth import plan_depth
from qcls.heads.weights_fingerprint import num_layers
from qcls.engine.bucket import token_buckets
from qcls.engine.layout import Packer, PromptLayout
from qcls.engine.prefix_cache import plan_prefixes
from qcls.errors import ConfigError, LabelSetError, QclsError
from qcls.scoring.strategies import get_strategy
from qcls.scoring.tokenization import token_text


@dataclass
class LabelCost:
    label: str
    tokens: int  # label_prefix + label
    trie_reads: int  # logits trie scoring reads for this label
    single_token_cost: bool  # trie_reads == 1: one logit at the root, however many tokens the label has
    extended_by: list[str]  # labels whose tokens start with this label's (it then needs the end token)


@dataclass
class PromptCheck:
    name: str
    prefix_tokens: int
    shared_prefix_tokens: int  # in prefix blocks another prompt uses too (stored and computed once)
    suffix_tokens: int
    row_trie_tokens: int  # label-trie tokens the configured strategy places after the suffix in each row
    end_token: str | None  # the token that ends a label another label extends (None: no such label)
    labels: list[LabelCost]


@dataclass
class ForwardTokens:
    batch: int
    query_tokens: int  # per query
    tokens: int  # the packed forward's tokens for exactly these queries
    bucket_tokens: int | None  # tokens of the captured bucket that runs it (None: beyond the largest)


@dataclass
class BackendFit:
    backend: str
    applies: bool  # whether it can load this checkpoint at all (GPTQ/AWQ checkpoints need backend=gptq)
    total_gib: float
    weights_gpu_gib: float
    weights_cpu_gib: float
    kv_buffer_gib: float
    activations_gib: float
    layers_on_gpu: int
    n_layers: int
    fits: bool | None  # None: no budget to compare with
    note: str = ""


@dataclass
class CheckReport:
    model: str
    source: str
    model_config: dict[str, Any]
    strategy: str
    engine: str
    backend: str
    budget_gib: float | None
    prompts: list[PromptCheck] = field(default_factory=list)
    prefix_pool_tokens: int = 0
    forward: list[ForwardTokens] = field(default_factory=list)
    backends: list[BackendFit] = field(default_factory=list)
    # the head file (calibration=FILE or the model's default): which prompts use it, method, what each reads
    head: dict[str, Any] | None = None
    # how deep the forward runs (qcls/heads/depth.py): layers, of, label_scores, why; the estimates count those layers
    depth: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)  # what would stop `qcls classify` with this config

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _gib(b: int | float) -> float:
    return round(b / memory.GIB, 2)


def describe_config(mc) -> dict[str, Any]:
    keys = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings", "max_position_embeddings")
    out = {k: getattr(mc, k, None) for k in keys}
    q = getattr(mc, "quantization_config", None)
    out["quantization"] = (q if isinstance(q, dict) else q.to_dict()).get("quant_method") if q else None
    return out


def label_costs(layout: PromptLayout) -> list[LabelCost]:
    trie_plan = get_strategy("trie").plan(layout.trie)
    ids = layout.tokens.label_ids
    out = []
    for li, (lab, lid) in enumerate(zip(layout.tokens.labels, ids)):
        reads = int((trie_plan.weights[li] != 0).sum())
        longer = [o for o, oid in zip(layout.tokens.labels, ids) if len(oid) > len(lid) and oid[:len(lid)] == lid]
        out.append(LabelCost(lab, len(lid), reads, reads == 1, longer))
    return out


def prompt_checks(cfg: QclsConfig, tokenizer, scored: bool = True) -> tuple[list[PromptLayout], list[PromptCheck],
                                                                             list[str]]:
    """Layouts and facts of every prompt that can be scored, and a message for each that cannot; `scored=False`:
    the rows of a forward that stops at the heads' layer (no trie tokens)."""
    strategy = get_strategy(cfg.strategy)
    layouts, problems = [], []
    for spec in cfg.prompts:
        try:
            layouts.append(PromptLayout.from_spec(tokenizer, spec, strategy, scored))
        except LabelSetError as e:
            problems.append(str(e))
    pool = plan_prefixes([lay.tokens.prefix_ids for lay in layouts], cfg.engine.prefix_block_size)
    checks = []
    for p, lay in enumerate(layouts):
        end = token_text(tokenizer, lay.trie.end_id) if lay.trie.needs_end() else None
        checks.append(PromptCheck(lay.tokens.name, len(lay.tokens.prefix_ids), pool.shared_tokens(p),
                                  len(lay.tokens.suffix_ids), len(lay.row_nodes), end, label_costs(lay)))
    return layouts, checks, problems


def forward_tokens(cfg: QclsConfig, layouts: list[PromptLayout], query_tokens: int) -> tuple[int, list[ForwardTokens]]:
    """(prefix pool tokens, tokens per forward at batch 1 and engine.max_batch_size) by the packer's rule."""
    pool = plan_prefixes([lay.tokens.prefix_ids for lay in layouts], cfg.engine.prefix_block_size)
    packer = Packer(layouts, pool, pool.n_slots, max_query=1)
    out = []
    for b in sorted({1, cfg.engine.max_batch_size}):
        total = b * query_tokens
        bucket = next((lt for lt in token_buckets(cfg.engine.query_buckets, b) if lt >= total), None)
        out.append(ForwardTokens(b, query_tokens, packer.n_tokens(b, total),
                                 None if bucket is None else packer.n_tokens(b, bucket)))
    return pool.n_slots, out


def gpu_backend(cfg: QclsConfig) -> str:
    """The backend the configuration runs on a GPU, whose memory the check estimates: auto's is fp16."""
    return "fp16" if cfg.backend.name == AUTO else cfg.backend.name


def backend_fits(cfg: QclsConfig, mc, layers: int | None = None) -> tuple[list[BackendFit], str | None]:
    """Every registered backend's estimate against the budget, and the refusal the configured backend
    would meet at start-up (None when it fits or there is no budget); `layers`: only that many are loaded."""
    budget = memory.budget_bytes(cfg)
    fits, refusal = [], None
    on_gpu = gpu_backend(cfg)
    for name in BACKENDS:
        applies = memory.applies(name, mc)
        try:
            e = memory.estimate(cfg, mc, backend=name, budget=budget, layers=layers)
        except ValueError as err:
            fits.append(BackendFit(name, applies, 0, 0, 0, 0, 0, 0, 0, None, str(err)))
            continue
        note = e.streaming()
        if not applies:
            note = ("needs a GPTQ/AWQ checkpoint (estimate for a 4-bit build of this model)" if name == "gptq"
                    else "this is a GPTQ/AWQ checkpoint: it loads with backend=gptq only")
        fits.append(BackendFit(name, applies, _gib(e.total), _gib(e.weights_gpu), _gib(e.weights_cpu),
                               _gib(e.kv_buffer), _gib(e.activations), e.layers_on_gpu, e.n_layers,
                               None if budget is None else e.total <= budget, note))
        if name == on_gpu:
            try:
                memory.check_budget(cfg, e)
            except memory.MemoryBudgetError as err:
                refusal = str(err)
    return fits, refusal


def build(cfg: QclsConfig, query_tokens: int = 8) -> CheckReport:
    if query_tokens < 1 or query_tokens > cfg.max_query_tokens:
        raise ConfigError(f"--query-tokens {query_tokens} is outside 1..max_query_tokens={cfg.max_query_tokens}",
                          "give a query length the config accepts, or raise max_query_tokens (and "
                          "engine.query_buckets)")
    src = sources.config_source(cfg.model, cfg.cache_dir)
    with sources.gguf_metadata_read_once():
        mc = sources.load_config(src)
        tokenizer = sources.load_tokenizer(src)
    where = src.path + (f" ({src.gguf_file})" if src.gguf_file else "")
    budget = memory.budget_bytes(cfg)
    rep = CheckReport(cfg.model.name, f"{cfg.model.source}: {where}", describe_config(mc), cfg.strategy,
                      cfg.engine.kind, cfg.backend.name + (" (int8 on a CPU, fp16 on a GPU)" if cfg.backend.name == AUTO
                                                           else ""), None if budget is None else _gib(budget))
    rep.head, head = head_check(cfg, mc, rep.problems)
    depth = plan_depth(num_layers(mc), head, [p.name for p in cfg.prompts], enabled=cfg.engine.layer_exit,
                       engine=cfg.engine.kind, default_head=bool(rep.head and rep.head["default"]))
    rep.depth = depth.as_dict()
    layouts, rep.prompts, problems = prompt_checks(cfg, tokenizer, depth.scores)
    rep.problems = problems + rep.problems
    if layouts:
        rep.prefix_pool_tokens, rep.forward = forward_tokens(cfg, layouts, query_tokens)
    rep.backends, refusal = backend_fits(cfg, mc, depth.loads_part)
    if refusal:
        rep.problems.append(refusal)
    if not memory.applies(gpu_backend(cfg), mc):
        rep.problems.append(next(b.note for b in rep.backends if b.backend == gpu_backend(cfg))
                            + f" (backend={cfg.backend.name})")
    return rep


def head_check(cfg: QclsConfig, mc, problems: list[str]) -> tuple[dict[str, Any] | None, Any]:
    """The start-up checks of `calibration=FILE` that need no weights (qcls/heads/startup.py), and the head that
    would serve (None: none); a refusal goes into `problems`. Whether a head was fitted on these very weights is
    checked once they are loaded."""
    from qcls.heads import startup
    from qcls.heads.files import CalibrationError
    try:
        c = startup.choose(cfg)
        try:
            startup.check_model_config(c.head, c.path, mc)
        except CalibrationError as e:
            if not c.default:
                raise
            c.drop("the model's default head does not fit this architecture")
            c.notes.append(f"the model's default head is not used: {e.what}")
    except CalibrationError as e:
        problems.append(str(e))
        return None, None
    if c.file is None:
        return None, None
    head = c.head
    return {"file": c.path or c.file, "default": c.default, "line": c.line(), "with_head": c.with_head(),
            "own_scores": dict(c.own), "method": head.method if head else None, "notes": c.notes,
            "weights_checked_at_start_up": bool(head and head.reads_states),
            "prompts": {n: ("raw scores (affine)" if ph.read is None else
                            f"{ph.read.kind} @ layer {ph.read.layer}" + (" + raw scores" if ph.score_weights is not None
                                                                           else ""))
                        for n, ph in (head.prompts.items() if head else [])}}, head


def verdict(rep: CheckReport) -> QclsError | None:
    """The error start-up would meet, as one message, or None when the configuration can start."""
    if not rep.problems:
        return None
    return ConfigError(f"{len(rep.problems)} problem(s) would stop `qcls classify` with this configuration:\n"
                       + "\n".join("- " + p.replace("\n", "\n  ") for p in rep.problems))
