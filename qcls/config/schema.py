"""The validated configuration: what Hydra composes is checked here before anything loads.

Every model forbids unknown keys, so a typo in an override is an error that names the key instead of a
setting silently ignored.
"""
from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_PROMPTS = 16
# `calibration: model` (conf/config.yaml's default): the model's own head file (model.head), for the prompts it
# was fitted for only; a file named by the user is held to every prompt (qcls/heads/startup.py)
MODEL_HEAD = "model"
STRATEGIES = ("first_token", "trie", "exact", "mean_logprob")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PromptSpec(_Strict):
    """One classification prompt: a template with exactly one `{query}` and the labels to choose from."""

    name: str = Field(min_length=1)
    template: str
    label_prefix: str = " "
    labels: list[str]
    # Token text that ends a label when one label's tokens are a prefix of another's; None = the
    # tokenizer's end-of-turn / eos token.
    label_end: str | None = None

    @field_validator("template")
    @classmethod
    def _one_query(cls, v: str) -> str:
        n = v.count("{query}")
        if n != 1:
            raise ValueError(f"template must contain exactly one '{{query}}' placeholder, found {n}")
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: list[str]) -> list[str]:
        if len(v) < 2:
            raise ValueError(f"a prompt needs at least 2 labels, got {len(v)}")
        empty = [i for i, lab in enumerate(v) if not lab.strip()]
        if empty:
            raise ValueError(f"labels at positions {empty} are empty or whitespace-only")
        dup = sorted({lab for lab in v if v.count(lab) > 1})
        if dup:
            raise ValueError(f"duplicate labels {dup}: every label must be distinct")
        return v

    @property
    def prefix(self) -> str:
        return self.template.split("{query}")[0]

    @property
    def suffix(self) -> str:
        return self.template.split("{query}")[1]


class ModelSpec(_Strict):
    """Where the weights come from. `source` says how `path` is read."""

    name: str
    source: Literal["demo", "local", "hub", "gguf"]
    path: str | None = None  # local dir (local), repo id (hub), .gguf file or dir (gguf)
    gguf_file: str | None = None  # file name inside `path` when `path` is a directory or hub id
    revision: str | None = None
    # Architecture facts for the memory estimate when the config cannot be read yet (informational).
    family: Literal["llama", "qwen2", "qwen3", "gemma3"] | None = None
    # The head file this model's configs load by default (conf/config.yaml: calibration: model), for the prompts
    # it was fitted for
    head: str | None = None

    @model_validator(mode="after")
    def _needs_path(self) -> "ModelSpec":
        if self.source != "demo" and not self.path:
            raise ValueError(f"model.path is required when model.source is '{self.source}'")
        return self


class BackendSpec(_Strict):
    """Which backend turns the checkpoint into the modules the engine calls (see qcls/backends/)."""

    name: str = "auto"  # int8 on a CPU, fp16 on a GPU (qcls/backends/registry.py)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # auto: float16 on a GPU, float32 on the CPU (fp16 matmuls on the CPU are slow and less exact)
    dtype: Literal["auto", "float16", "float32"] = "auto"
    options: dict[str, Any] = Field(default_factory=dict)


class ScoringSpec(_Strict):
    name: Literal["first_token", "trie", "exact", "mean_logprob"] = "trie"
    # vocabulary rows per chunk of the full-vocabulary normaliser (exact / mean_logprob)
    vocab_chunk: int = Field(default=16384, ge=256)


class EngineSpec(_Strict):
    """The execution path. `fast` is the packed single-forward engine; `reference` the slow ground truth."""

    kind: Literal["fast", "reference"] = "fast"
    max_batch_size: int = Field(default=4, ge=1, le=16)
    # Query-token buckets; the largest must cover max_query_tokens.
    query_buckets: list[int] = Field(default_factory=lambda: [4, 8, 12, 16, 24, 32, 48, 64])
    cuda_graphs: bool = True
    # tree: the Triton kernel that visits only visible keys (needs CUDA + Triton); sdpa: dense masked SDPA;
    # auto: tree where it runs, else sdpa (with a note in the result metadata on a GPU)
    attention: Literal["auto", "tree", "sdpa"] = "auto"
    warmup_requests: int = Field(default=2, ge=1)
    prefix_block_size: int = Field(default=16, ge=1)
    # heads per program of the fused q/k/v kernel (RoPE, q/k norms, KV write): 0 = auto (the largest power of
    # two ≤ 8 dividing the query and key/value head counts), 1 = one head per program (the unblocked q/k/v kernel)
    qkv_heads_per_program: int = Field(default=0, ge=0, le=8)
    # Gemma3: each post-norm (after attention, after the MLP) in one launch with the residual add and the next
    # norm; false runs them as two launches
    fuse_post_norms: bool = True
    # the tree attention's kernels do the q/k/v kernel's work (q/k norms, RoPE, the KV write) themselves: one
    # launch fewer per layer (H100, per request: Gemma3-4B 1 % faster, Qwen3-4B 0.6-0.7 % with the row kernel's
    # 16-key steps; bench/RESULTS.md); false runs the q/k/v kernel before attention (the unfused kernels). Dense SDPA
    # (engine.attention=sdpa, CPUs) always runs the q/k/v kernel.
    fuse_qkv_attention: bool = True
    # the tail's sibling-group normaliser (scoring=trie) as one kernel on a GPU; false: the torch ops (gathers,
    # log-sum-exps, subtraction: eight launches)
    fuse_tail: bool = True
    # the forward stops after the deepest layer a head reads when every prompt's answer comes from a head that
    # reads a hidden state (no label scores, no final norm, later layers and an untied LM head never loaded:
    # qcls/heads/depth.py); false runs every layer and keeps the raw scores beside the heads'
    layer_exit: bool = True
    # answers kept per Classifier, keyed by (configuration fingerprint, query): a server answers a repeated
    # query from them without a forward (Classifier.classify(cache=True) from Python); 0 turns it off
    result_cache_entries: int = Field(default=10_000, ge=0)

    @field_validator("query_buckets")
    @classmethod
    def _buckets(cls, v: list[int]) -> list[int]:
        if not v or any(b < 1 for b in v):
            raise ValueError("query_buckets must be a non-empty list of positive token counts")
        return sorted(set(v))


class PredictionLogSpec(_Strict):
    """What a serving replica writes of its answers (qcls/predictions/log.py, docs/serving.md "Prediction log"):
    nothing unless `folder` is set."""

    # made absolute where the config is composed: replicas run in a directory of Ray's choosing
    folder: str | None = None
    sample_rate: float = Field(default=1.0, gt=0, le=1)  # the share of answered queries written (random per row)
    all_labels: bool = False  # every label's probability (prob:<prompt>:<label>), not only the winner's
    format: Literal["jsonl", "parquet"] = "jsonl"  # parquet needs pyarrow
    flush_s: float = Field(default=2.0, gt=0, le=3600)  # a part file at least this often while rows come
    queue_rows: int = Field(default=10_000, ge=1)  # rows waiting for the writer; more are dropped and counted

    @field_validator("folder")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("give a folder, or null to turn the prediction log off")
        return None if v is None else os.path.abspath(os.path.expanduser(v))


class ServeSpec(_Strict):
    """How Ray Serve runs the Classifier (qcls/deployments/): `qcls serve`, serve_config.yaml, bench/load.py."""

    app_name: str = "qcls"
    route_prefix: str = "/"
    host: str = "127.0.0.1"  # 0.0.0.0 to accept other machines' requests
    port: int = Field(default=8000, ge=0, le=65535)
    num_replicas: int = Field(default=1, ge=1)
    # Ray Serve autoscaling_config (min_replicas, max_replicas, target_ongoing_requests …); replaces num_replicas
    autoscaling: dict[str, Any] | None = None
    num_gpus: float = Field(default=0, ge=0)  # per replica: 1 pins one card; 0 for the CPU demo
    num_cpus: float = Field(default=1, ge=0)
    # HTTP ingress (docs/serving.md): "direct" = each replica serves HTTP on its own port (Ray Serve direct
    # ingress, RAY_SERVE_THROUGHPUT_OPTIMIZED) beside the routed Serve proxy on `port`; "proxy" = the proxy
    # only; "haproxy" = HAProxy on `port` in front of direct-ingress replicas
    ingress: Literal["direct", "proxy", "haproxy"] = "direct"
    # 0 = no idle wait: a lone query goes at once and queries arriving during a forward form the next batch;
    # > 0 = @serve.batch first gathers for up to this long (fuller batches, added latency at light load)
    batch_wait_timeout_s: float = Field(default=0.0, ge=0, le=1)
    # a stopping direct-ingress replica keeps its port open this long for load balancers (Ray's default 30)
    drain_s: float = Field(default=2.0, ge=0)
    retry_after_s: int = Field(default=1, ge=0)  # the Retry-After header of every 503
    # Serve's access log, one line per request in the replica's log file. Off: at hundreds of requests a
    # second the lines are pure overhead on the replica's event loop (the metrics count requests instead)
    access_log: bool = False
    # Prometheus metrics (Ray's export port) when qcls starts Ray; None = a port Ray picks
    metrics_export_port: int | None = Field(default=None, ge=1, le=65535)
    # the replica's Python thread switch interval; None leaves Python's 5 ms. 0.5 ms (meant to hand the GIL
    # back to the engine thread sooner) measured slower on the H100 (bench/RESULTS.md, the serving levers' second run)
    gil_switch_interval_ms: float | None = Field(default=None, gt=0)
    # batches in flight in a replica: 2 = the next batch is tokenized and queued while the current one runs
    # (the host's work overlaps the device's); 1 = one at a time
    pipeline_depth: int = Field(default=2, ge=1, le=2)
    # with 2 in flight: the next batch gathers queries until shortly before the running one should end (by
    # measured device times), not only those waiting the moment a slot frees; an idle device never waits
    fill_while_busy: bool = True
    # None = 16 × engine.max_batch_size: waiting queries queue in the replica (FIFO, batched as the device
    # frees up) rather than in Serve's router, which backs off for 100s of ms when a replica is full
    max_ongoing_requests: int | None = Field(default=None, ge=1)
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    health_check_period_s: float = Field(default=10, gt=0)
    health_check_timeout_s: float = Field(default=30, gt=0)
    # check_health runs a real forward after this long without a successful one (or after any engine error)
    health_probe_idle_s: float = Field(default=60, gt=0)
    fault_injection: bool = False  # tests only: lets a handle call break the engine on purpose
    # every route but /healthz needs `Authorization: Bearer <key>` (qcls/config/api_key.py): the key itself, or a
    # file whose first line is the key; neither: the environment variable QCLS_API_KEY; none: open
    api_key: str | None = Field(default=None, repr=False)
    api_key_file: str | None = None
    prediction_log: PredictionLogSpec = PredictionLogSpec()  # off unless prediction_log.folder is set


class QclsConfig(_Strict):
    model: ModelSpec
    backend: BackendSpec = BackendSpec()
    scoring: ScoringSpec = ScoringSpec()
    engine: EngineSpec = EngineSpec()
    prompts: list[PromptSpec]
    force_single_token_labels: bool = False
    max_query_tokens: int = Field(default=64, ge=1)
    max_queries_per_request: int = Field(default=16, ge=1)
    gpu_memory_gib: float | None = None  # budget checked before loading; None = the card's total
    cache_dir: str | None = None  # demo-model conversions and int8 calibrations; None = ~/.cache/qcls
    seed: int = 0
    serve: ServeSpec = ServeSpec()
    # a head or calibration file (qcls/heads/files.py): absolute, or relative to the cwd, then the repo;
    # `model` = model.head where it fits (see MODEL_HEAD); null = the LLM's own label scores
    calibration: str | None = None

    @field_validator("prompts")
    @classmethod
    def _prompts(cls, v: list[PromptSpec]) -> list[PromptSpec]:
        if not v:
            raise ValueError("at least one prompt is required")
        if len(v) > MAX_PROMPTS:
            raise ValueError(f"{len(v)} prompts given; at most {MAX_PROMPTS} fit one forward")
        names = [p.name for p in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate prompt names {dup}")
        return v

    @model_validator(mode="after")
    def _query_fits(self) -> "QclsConfig":
        if self.engine.kind == "fast" and self.max_query_tokens > self.engine.query_buckets[-1]:
            raise ValueError(
                f"max_query_tokens={self.max_query_tokens} exceeds the largest query bucket "
                f"{self.engine.query_buckets[-1]}: raise engine.query_buckets or lower max_query_tokens")
        return self

    @model_validator(mode="after")
    def _serve_fits(self) -> "QclsConfig":
        ongoing = self.serve.max_ongoing_requests
        if ongoing is not None and ongoing < self.engine.max_batch_size:
            raise ValueError(f"serve.max_ongoing_requests={ongoing} is below engine.max_batch_size="
                             f"{self.engine.max_batch_size}: a replica could never fill a batch")
        return self

    @property
    def max_ongoing_requests(self) -> int:
        """Requests one replica accepts at once (serve.max_ongoing_requests, or 16 × engine.max_batch_size)."""
        return self.serve.max_ongoing_requests or 16 * self.engine.max_batch_size

    @property
    def calibration_is_default(self) -> bool:
        """Whether the head file is the model's default (calibration=model), not one the user named."""
        return self.calibration == MODEL_HEAD

    @property
    def calibration_file(self) -> str | None:
        """The head or calibration file to load: model.head under calibration=model, else the named file."""
        return self.model.head if self.calibration_is_default else self.calibration

    @property
    def strategy(self) -> str:
        """The scoring strategy in force: force_single_token_labels overrides the `scoring` group."""
        return "first_token" if self.force_single_token_labels else self.scoring.name
