"""config → Classifier (load, prompts, prefix cache, graphs, warm-up) → classify(queries) → results."""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Generator, Iterator

import torch

from qcls.backends import sources
from qcls.backends.base import LoadedModel
from qcls.backends.device_memory import measured
from qcls.backends.registry import backend_for
from qcls.config.compose import compose
from qcls.config import QclsConfig
from qcls.engine.engine import FastEngine
from qcls.errors import ConfigError
from qcls.engine.layout import PromptLayout
from qcls.heads import startup as heads
from qcls.heads.depth import BEYOND_WAY_OUT, Depth, plan_depth
from qcls.heads.weights_fingerprint import num_layers
from qcls.heads.head import Tap
from qcls.progress import step, step_note, warn
from qcls.results import QueryResult
from qcls.results.answer_fingerprint import answer_fingerprint
from qcls.results.building import ResultBuilder, check_finite, fill_batch
from qcls.results.cache import ResultCache
from qcls.results.requests import Request, finish_batch, refused, start_batch
from qcls.scoring.reference import ReferenceEngine
from qcls.scoring.strategies import get_strategy
from qcls.scoring.tokenization import QueryEncoder, encode_query, tokenized

WARMUP_QUERY = "warm up query"


@dataclass
class Batch:
    """A started batch (Classifier.start): the results to fill, the tokenized good queries (index into
    results, ids, tokenize ms) and the engine's handle on its queued forward."""
    results: list[QueryResult]
    good: list[tuple[int, list[int], float]]
    launched: Any


class Classifier:
    """Everything is loaded, captured and warmed here; `classify` only tokenizes, replays and reads."""

    def __init__(self, cfg: QclsConfig | None = None, overrides: list[str] | tuple[str, ...] = (),
                 loaded: LoadedModel | None = None, taps: list[Tap] = ()):
        """`loaded`: weights already on the device (shared, as a reload shares its replica's); `taps`: hidden states
        to keep from every forward besides those a head reads (`read_states`, for fitting heads; fast engine only)."""
        for _ in self._steps(cfg if cfg is not None else compose(overrides), loaded, taps):
            pass

    @classmethod
    def in_steps(cls, cfg: QclsConfig, loaded: LoadedModel | None = None,
                 taps: list[Tap] = ()) -> Generator[str, None, "Classifier"]:
        """The same build, one step per `next()` (the checks and prompts, a prefix fill, a bucket, a capture, a
        warm-up request), each yielding what it did; returns the Classifier. A replica's device owner runs a
        reload's build this way, one step between two batches of the configuration it serves."""
        self = cls.__new__(cls)
        yield from self._steps(cfg, loaded, taps)
        return self

    def _steps(self, cfg: QclsConfig, loaded: LoadedModel | None, taps: list[Tap]) -> Iterator[str]:
        self.cfg, self.taps, self.startup_s = cfg, list(taps), {}
        t0 = time.perf_counter()
        # checked against the prompts before anything else loads: a file that does not fit fails in milliseconds
        self.heads = heads.choose(cfg)
        self.head, self.head_path, cal_notes = self.heads.head, self.heads.path, self.heads.notes
        backend = backend_for(cfg)
        with sources.gguf_metadata_read_once():  # a GGUF's header is read for the tokenizer, config and model
            loaded, given = self._read(backend, loaded)
        yield "the configuration's checks and prompts"  # the device work starts: a head's weight fingerprint copies
        self._check_head(heads.check_model_weights, loaded.model)  # weights off the device
        yield "the head's weight check"
        step_note(self.heads.line())  # per prompt: a head or the LLM's own label scores
        loaded = self._settle_depth(loaded, backend, given)
        step_note(self.depth.line())
        self.heads_meta, self._layers_meta, self.loaded = self.heads.meta(), self.depth.as_dict(), loaded
        # names the configuration in every result; keys the result cache (classify(cache=True), the server)
        self.fingerprint = answer_fingerprint(cfg, self.head_path)
        self.cache = ResultCache(cfg.engine.result_cache_entries)
        torch.manual_seed(cfg.seed)
        self._headed = [self.head is not None and n in self.head.prompts for n in self.prompt_names]
        # what building a result reads per prompt, looked up once here rather than per prompt of every result
        self._build = ResultBuilder([(lay.tokens.name, lay.tokens.labels, lay.label_token_counts, h)
                                     for lay, h in zip(self.layouts, self._headed)], self.depth.scores, self.head).build
        with step(f"building the {cfg.engine.kind} engine", self.startup_s, "engine"):
            self.engine = self._make_engine()
            yield "the engine's buffers"
            if isinstance(self.engine, FastEngine):
                yield from self.engine.build()
        self.notes = list(loaded.info) + cal_notes + list(loaded.notes) + list(getattr(self.engine, "notes", []))
        if cfg.engine.kind == "fast" and loaded.device.type == "cuda" and not self.engine.graphs:
            self.notes.append("CUDA graphs off: the forward runs eagerly (slower)")
        for n in self.notes:
            (step_note if n in loaded.info else warn)(n)
        with step(f"warm-up ({cfg.engine.warmup_requests} requests per bucket)", self.startup_s, "warmup"):
            yield from self._warm_up()
        self.startup_s["total"] = round(time.perf_counter() - t0, 3)
        self.measured_memory = measured(loaded.device)  # weights + KV pool + graph pools, and the peak
        if self.measured_memory:
            gib = {k: round(v / 2**30, 2) for k, v in self.measured_memory.items()}
            step_note(f"GPU memory after start-up (GiB): {gib}")

    def _read(self, backend, loaded: LoadedModel | None) -> tuple[LoadedModel, bool]:
        """The tokenizer, the checks that need no weights, the prompts, then the weights (unless given): (the
        model, whether the caller gave it)."""
        cfg = self.cfg
        if loaded is None:  # the tokenizer first: label sets are checked before any weight is read
            with step("loading the tokenizer", self.startup_s, "tokenizer"):
                self.tokenizer = sources.load_tokenizer(backend.source(cfg))
        else:
            self.tokenizer = loaded.tokenizer
        # the request path's tokenizer call: the fast backend where it gives the same ids, and a query cache
        self.encoder = QueryEncoder(self.tokenizer, cfg.max_query_tokens, check=(WARMUP_QUERY,))
        model_config = loaded.source_config if loaded is not None else None
        if loaded is None and self.head is not None and self.head.reads_states:
            model_config = sources.load_config(backend.source(cfg))  # the architecture before any weight is read
            self._check_head(heads.check_model_config, model_config)
        # how deep the forward runs (the layers the heads read) decides what the rows hold and what is loaded
        self.depth = self._plan_depth(model_config)
        with step(f"preparing {len(cfg.prompts)} prompts (strategy {cfg.strategy})", self.startup_s, "prompts"):
            self.layouts = self._prepare_prompts()
        given = loaded is not None
        if loaded is None:
            loaded = self._load(backend)
        self._check_head(heads.check_model_config, loaded.source_config)
        return loaded, given

    def _plan_depth(self, model_config) -> Depth:
        """Without a config (no head reads states) it is the whole depth, counted once loaded."""
        return plan_depth(num_layers(model_config) if model_config is not None else 0, self.head, self.prompt_names,
                          enabled=self.cfg.engine.layer_exit, engine=self.cfg.engine.kind, taps=self.taps,
                          default_head=self.heads.default)

    def _load(self, backend) -> LoadedModel:
        d = self.depth
        what = f"the first {d.loads} of {d.total} layers of " if d.loads_part else ""
        with step(f"loading {what}{self.cfg.model.name} with backend {backend.name}", self.startup_s, "load"):
            return backend.load(self.cfg, d.loads_part, self.tokenizer)  # read once, above

    def _settle_depth(self, loaded: LoadedModel, backend, given: bool) -> LoadedModel:
        """The depth again with the model in hand (a default head dropped by the weights check needs every layer);
        weights given by the caller (`loaded`) with fewer layers than this configuration reads are refused."""
        depth = self._plan_depth(loaded.source_config)
        if given and (why := depth.beyond(loaded.layers)):
            raise ConfigError(why, BEYOND_WAY_OUT)
        if not given and depth.loads > loaded.layers:
            warn(f"loading {self.cfg.model.name} again with {depth.loads} layers: {depth.reason}")
            self.depth = depth
            loaded = self._load(backend)
        if depth.scores != self.depth.scores:
            self.depth = depth
            self.layouts = self._prepare_prompts()
        self.depth = replace(depth, loaded=loaded.layers)  # what is loaded, whoever loaded it
        return loaded

    def _check_head(self, check, against) -> None:
        """A named file that does not fit the model is refused; the model's default head is then not used."""
        try:
            check(self.head, self.head_path, against)
        except heads.CalibrationError as e:
            if not self.heads.default:
                raise
            self.heads.drop("the model's default head does not fit these weights")
            self.heads.notes.append(f"the model's default head is not used: {e.what}")
            self.head = self.head_path = None

    def _prepare_prompts(self) -> list[PromptLayout]:
        strategy = get_strategy(self.cfg.strategy)
        return [PromptLayout.from_spec(self.tokenizer, spec, strategy, self.depth.scores) for spec in self.cfg.prompts]

    def _make_engine(self):
        cfg, ld = self.cfg, self.loaded
        prompt_heads = heads.prompt_heads(self.head, self.prompt_names)
        if cfg.engine.kind == "reference":
            if self.taps:
                raise ValueError("hidden-state taps are read by the fast engine: use engine.kind=fast")
            return ReferenceEngine(ld.model, self.layouts, cfg.strategy, prompt_heads)
        tokens = sorted({t for lay in self.layouts for t in lay.plan.entry_token})  # none when no label is scored
        full = ld.full_head() if self.layouts[0].plan.normaliser == "vocab" else None
        if self.layouts[0].plan.normaliser == "vocab" and full is None:
            raise ValueError(f"scoring={cfg.strategy} needs the full LM head on the device, which backend "
                             f"{ld.backend} does not keep; use scoring=trie or first_token, or backend=fp16")
        return FastEngine(ld.model, self.layouts, ld.head_rows(tokens) if tokens else None, tokens, full,
                          max_batch=cfg.engine.max_batch_size, query_buckets=cfg.engine.query_buckets,
                          block_size=cfg.engine.prefix_block_size, vocab_chunk=cfg.scoring.vocab_chunk,
                          use_graphs=cfg.engine.cuda_graphs and ld.graph_capturable, embed_fn=ld.embed_fn,
                          attention=cfg.engine.attention, heads=prompt_heads, taps=self.taps,
                          qkv_heads=cfg.engine.qkv_heads_per_program, fuse_post_norms=cfg.engine.fuse_post_norms,
                          fuse_qkv_attention=cfg.engine.fuse_qkv_attention, fuse_tail=cfg.engine.fuse_tail,
                          stop_after=self.depth.layers if self.depth.stops_early else None)

    def _warm_up(self) -> Iterator[str]:
        """Every bucket, then the request path; records each batch size's device time (forward + score, ms) in
        `device_ms`, which a server uses to time the batch it queues behind a running one."""
        self.device_ms: dict[int, float] = {}
        ids = encode_query(self.tokenizer, WARMUP_QUERY, self.cfg.max_query_tokens)
        if self.cfg.engine.kind == "reference":
            self.engine.run([ids])
            return
        # On the CPU no graph is captured and every bucket runs the same eager kernels: the request path below pages
        # the weights in; a pass per bucket would cost seconds each and make a demo's first command minutes longer.
        keys = sorted(self.engine.buckets) if self.engine.device.type == "cuda" else []
        for b, total in keys:
            lengths = [total // b + (i < total % b) for i in range(b)]  # b queries with `total` tokens
            for _ in range(self.cfg.engine.warmup_requests):
                self.engine.run([(ids * total)[:n] for n in lengths])
                yield f"bucket {b}×{total}: warm-up request"
        # Then the request path, results included: on a GPU two batches in flight, as a server runs them, so every
        # host slot and device event gets its first use; the CPU computes a batch as it is launched (one pass each).
        for b in range(1, self.cfg.engine.max_batch_size + 1):
            passes = 2 if self.engine.device.type == "cuda" or b == 1 else 1  # b = 1: the second slot's first use
            jobs = [self.start([WARMUP_QUERY] * b) for _ in range(passes)]
            done = [self.finish(job) for job in jobs][-1]
            check_finite(done[0], self.loaded.dtype)
            t = done[0].timings_ms
            self.device_ms[b] = t["forward"] + t["score"]
            yield f"the request path at {b} queries"

    @property
    def prompt_names(self) -> list[str]:
        return [p.name for p in self.cfg.prompts]

    def metadata(self) -> dict[str, Any]:
        ld, cfg = self.loaded, self.cfg
        meta = {"model": cfg.model.name, "backend": ld.backend, "device": str(ld.device),
                "dtype": str(ld.dtype).replace("torch.", ""), "engine": cfg.engine.kind, "strategy": cfg.strategy,
                "prompts": self.prompt_names, "startup_s": self.startup_s, "memory": dict(ld.memory),
                "calibration": self.head_path, "head": self.head and self.head.summary(), "heads": self.heads_meta,
                "layers": self.depth.as_dict(), "notes": self.notes, "fingerprint": self.fingerprint,
                "result_cache": self.cache.stats()}
        if isinstance(self.engine, FastEngine):
            st = self.engine.stats()
            meta.update(graphs=st.graphs, attention=st.attention, prefix_cache=st.prefix, buckets=st.buckets)
            meta["memory"]["kv_buffer"] = st.kv_buffer_bytes
        meta["memory"].update(self.measured_memory)
        return meta

    def classify(self, queries: list[str], cache: bool = False) -> list[QueryResult]:
        """Classify queries under every prompt; a bad query gets an error result and the rest proceed, and a batch
        whose forward raises is retried query by query, as a server and `qcls bulk` retry it (results/requests.py).
        With cache=True a query this Classifier has answered before is answered from `self.cache` (no forward; its
        meta["cache"] says "hit") and the new answers are kept there (engine.result_cache_entries of them)."""
        req, n = self.open(queries, cache), self.cfg.engine.max_batch_size
        chunks = [req.todo[c:c + n] for c in range(0, len(req.todo), n)]
        return req.close([r for chunk in chunks for r in finish_batch(self, chunk, start_batch(self, chunk))])

    def open(self, queries: list, cache: bool = False) -> Request:
        """The request path's first step (results/requests.py), for `classify` and a server alike: the queries
        refused and those answered from the cache (cache=True) are answered; `todo` is left for forwards
        (`start`/`finish`), whose answers `Request.close` puts in place."""
        return Request.open(queries, self.encoder, self.cache if cache else None, self.fingerprint)

    def start(self, queries: list[str]) -> Batch:
        """The first half of `classify` for at most engine.max_batch_size queries: tokenize and queue their
        forward without waiting for it. A server starts the next batch before finishing this one, so the
        host's work on either overlaps the device's; at most two batches may be started and unfinished."""
        if len(queries) > self.cfg.engine.max_batch_size:
            raise ValueError(f"start takes at most engine.max_batch_size={self.cfg.engine.max_batch_size} "
                             f"queries, got {len(queries)}: use classify, which splits them")
        return self._launch(*self._tokenize(queries))

    def done(self, batch: Batch) -> bool:
        """Whether `finish` would return without waiting for the device; never blocks."""
        return batch.launched is None or self.engine.done(batch.launched)

    def finish(self, batch: Batch, wait_is_queue: bool = False) -> list[QueryResult]:
        """Wait for a started batch and build its results. The time its forward waited for the device (a
        batch ahead of it, the launch) counts as `prepare`, or with wait_is_queue=True is left out of the
        stages and returned as the results' `timings_ms["device_wait"]` (a server adds it to queue_wait)."""
        if batch.launched is None:  # no good query: nothing was queued
            return batch.results
        raw, calibrated, stages, n_tokens, *probs = self.engine.collect(batch.launched)
        # the fast engine's probabilities come from the device; the reference engine's are computed here
        raw_p, cal_p = probs[0] if probs else ([None] * len(raw), [None] * len(raw))
        wait = stages.pop("device_wait")
        if not wait_is_queue:
            stages["prepare"] += wait
        t0 = time.perf_counter()
        built = [self._build(s, c, p, cp) for s, c, p, cp in zip(raw, calibrated, raw_p, cal_p)]
        post = (time.perf_counter() - t0) * 1e3
        meta = {"engine": self.cfg.engine.kind, "strategy": self.cfg.strategy, "tokens_per_forward": n_tokens,
                "graphs": getattr(self.engine, "graphs", False), "calibration": self.head_path,
                "heads": self.heads_meta, "layers": self._layers_meta, "notes": self.notes,
                "fingerprint": self.fingerprint}
        return fill_batch(batch.results, batch.good, built, stages, post, meta, wait if wait_is_queue else None)

    def _tokenize(self, queries: list[str]) -> tuple[list[QueryResult], list[tuple[int, list[int], float]]]:
        results, good = [QueryResult(query=q) for q in queries], []
        for i, q in enumerate(queries):
            t0 = time.perf_counter()
            ids, why = tokenized(self.encoder, q)
            if why is not None:
                results[i] = refused(q, why)
            else:
                results[i].query_tokens = len(ids)
                good.append((i, ids, (time.perf_counter() - t0) * 1e3))
        return results, good

    def _launch(self, results: list[QueryResult], good: list[tuple[int, list[int], float]]) -> Batch:
        return Batch(results, good, self.engine.launch([ids for _, ids, _ in good]) if good else None)

    def read_states(self, queries: list[str]) -> tuple[list[QueryResult], list["torch.Tensor | None"]]:
        """Results and, per query, the hidden states of every tap [taps, prompts, H] (None for a refused
        query), from the same forwards; for fitting heads (the Classifier must be built with `taps`)."""
        if not isinstance(self.engine, FastEngine) or not self.engine.taps:
            raise ValueError("read_states needs the fast engine built with taps: Classifier(cfg, taps=[...])")
        results, good = self._tokenize(queries)
        states: list[torch.Tensor | None] = [None] * len(queries)
        n_p, step_ = len(self.layouts), self.cfg.engine.max_batch_size
        for c in range(0, len(good), step_):
            batch = self._launch(results, good[c:c + step_])
            self.finish(batch)  # one batch at a time: its taps are still in the buffer
            st = self.engine.states(batch.launched)
            for k, (i, _, _) in enumerate(batch.good):
                states[i] = st[:, k * n_p:(k + 1) * n_p]
        return results, states
