"""The Ray Serve deployment: one replica = one `Classifier` on one device, concurrent queries batched into one
`classify` call (one forward).

    serve run serve_config.yaml                                   # the app as configured there
    serve run qcls.deployments.app:build_app model=qwen3_4b serve.num_gpus=1
    qcls serve model=qwen3_4b serve.num_gpus=1                    # the same from qcls's CLI

Python callers use a DeploymentHandle; `classify` returns the `qcls.results.QueryResult` dataclasses that
`Classifier.classify` returns, with `timings_ms` gaining queue_wait and in_replica:

    handle = classifier_handle("qcls")     # qcls.cli.serve: serve.get_app_handle with pickle, not cloudpickle
    results = handle.classify.remote(["red hoodie", "maxi dress"]).result()
"""
from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any

from ray import serve
from ray.serve import Application

from qcls.backends.device_memory import memory_now
from qcls.classifier import Classifier
from qcls.config.autoscaling import autoscaling_config
from qcls.config.compose import ConfigError, compose
from qcls.config import QclsConfig
from qcls.config.reloads import deployment_version, redacted
from qcls.heads.startup import portable
from qcls.deployments.http import build_http_app
from qcls.deployments.ingress import serve_env
from qcls.deployments.metrics import ReplicaMetrics
from qcls.deployments.reload import Reloader
from qcls.deployments.worker import EngineWorker, Pending
from qcls.errors import QclsError, format_error
from qcls.predictions.log import PredictionLog
from qcls.results import QueryResult


@serve.deployment(name="QclsClassifier")
@serve.ingress()
class QclsDeployment:
    def __init__(self, cfg: QclsConfig, base: dict[str, Any] | None = None):
        """`base`: the app's own {"overrides", "config_dir"}, under a user_config's overrides (reload.py)."""
        # Everything loads, captures and warms here: Serve marks the replica ready only once this returns.
        if cfg.serve.gil_switch_interval_ms:  # the device threads' Python stages wait less on a busy event loop
            sys.setswitchinterval(cfg.serve.gil_switch_interval_ms / 1e3)
        self.metrics = ReplicaMetrics(cfg.engine.max_batch_size)
        try:  # (the prediction log's folder is checked first: a bad one is refused before the model loads)
            log = cfg.serve.prediction_log
            self.predictions = PredictionLog(log, observer=self.metrics.prediction_log_rows) if log.folder else None
            self.faults = fault_injection(cfg)
            clf = Classifier(cfg)
        except QclsError as e:  # the clean message in the replica log; `qcls serve` shows it too (qcls/cli/serve.py)
            print(format_error(e, "qcls replica"), file=sys.stderr, flush=True)
            raise
        self.worker = EngineWorker(clf, probe_idle_s=cfg.serve.health_probe_idle_s,
                                   probe_timeout_s=0.8 * cfg.serve.health_check_timeout_s, observer=self.metrics,
                                   depth=cfg.serve.pipeline_depth, fill_while_busy=cfg.serve.fill_while_busy)
        # batch_wait_timeout_s=0 (the default): queries go straight to the worker's queue, so a lone query
        # starts at once and those arriving during a forward share the next one. > 0: @serve.batch first
        # gathers for that long. The decorator's sizes are placeholders for the config's.
        self._gather = cfg.serve.batch_wait_timeout_s > 0
        self._batched.set_max_batch_size(cfg.engine.max_batch_size)
        self._batched.set_batch_wait_timeout_s(cfg.serve.batch_wait_timeout_s)
        self.reloader = Reloader(self.worker, base or {}, self.metrics)

    @property
    def clf(self) -> Classifier:
        """The active Classifier (the worker's: a reload swaps it)."""
        return self.worker.clf

    @property
    def cfg(self) -> QclsConfig:
        """The active configuration (a reload changes its prompts, head and limits, never its serve part)."""
        return self.clf.cfg

    def reconfigure(self, user_config: dict[str, Any] | None) -> None:
        """Serve calls this with the deployment's user_config at start-up and whenever it changes: the new
        configuration is built beside the serving one, which keeps answering (reload.py, EngineWorker.reload)."""
        self.reloader.request(user_config)

    def __serve_build_asgi_app__(self):
        return build_http_app(self)

    @serve.batch(max_batch_size=4, batch_wait_timeout_s=0.005)
    async def _batched(self, items: list[Pending]) -> list[asyncio.Future]:
        # Hands the gathered batch to the device queue and returns at once, so that this batcher is free
        # to gather the next batch while the forward runs (see EngineWorker.submit).
        return self.worker.submit(items)

    # -- handle API ------------------------------------------------------------------------------------

    async def classify(self, queries: list[str]) -> list[QueryResult]:
        """Classify `queries` (at most max_queries_per_request) under every prompt; as `Classifier.classify`,
        a refused query gets `error` set and the others proceed. Each query joins the batch being gathered
        from all concurrent requests."""
        arrived = time.perf_counter()
        if isinstance(queries, str) or not isinstance(queries, (list, tuple)):
            raise TypeError(f"classify takes a list of query strings, got {type(queries).__name__}")
        if len(queries) > self.cfg.max_queries_per_request:
            self.metrics.refused_query("max_queries_per_request")
            raise ValueError(f"{len(queries)} queries, over max_queries_per_request="
                             f"{self.cfg.max_queries_per_request}: split them over several calls")
        # one configuration answers the whole request, even if a reload swaps the active one meanwhile; its request
        # path refuses the bad queries (before they take a batch slot) and answers the cached ones
        clf = self.clf
        if sum(len(q) for q in queries if isinstance(q, str)) <= INLINE_CHARS:
            req = clf.open(list(queries), cache=True)
        else:  # tokenizing up to a body limit of text takes a while: off the event loop
            req = await asyncio.to_thread(clf.open, list(queries), True)
        good = [Pending(q, arrived, clf) for q in req.todo]
        if self._gather:
            futures = await asyncio.gather(*(self._batched(it) for it in good))
        else:
            futures = self.worker.submit(good)
        answers = [await futures[0]] if len(futures) == 1 else list(await asyncio.gather(*futures))
        known = [(r is not None, r is not None and r.error is not None) for r in req.results]  # (answered, refused)
        out = req.close(answers)
        for r, (answered, refused) in zip(out, known):
            if refused:
                self.metrics.refused_query(r.error)
                continue
            if answered:  # from the cache
                r.timings_ms["queue_wait"] = 0.0
            r.timings_ms["in_replica"] = round((time.perf_counter() - arrived) * 1e3, 4)
        if req.cache is not None:
            self.metrics.cache_use(req.hits, len(good), req.evicted, len(clf.cache) if clf is self.clf else None)
        if self.predictions is not None:  # the answers, their cache hits and latencies are all known here
            self.predictions.add(out)
        return out

    def prompts(self) -> list[dict[str, Any]]:
        return [{"name": p.name, "labels": list(p.labels)} for p in self.cfg.prompts]

    def reload_state(self) -> dict[str, Any]:
        """The active configuration's fingerprint and prompts, and how the last reload went (reload.py)."""
        return self.reloader.state.as_dict()

    async def reload_outcome(self, request_id: str, timeout_s: float) -> dict[str, Any] | None:
        """This replica's reload_state once it has built or refused the request `request_id`; None if not within
        `timeout_s`."""
        return await asyncio.to_thread(self.reloader.outcome, request_id, timeout_s)

    def active_config(self) -> dict[str, Any]:
        """The active configuration, as JSON (the API key as its hash): `qcls reload` compares against it."""
        return redacted(self.cfg).model_dump(mode="json")

    def metadata(self) -> dict[str, Any]:
        return self.clf.metadata()

    def replica_stats(self) -> dict[str, Any]:
        """This replica's process id, its memory now (`memory`: RSS and, on a GPU, torch's allocated and reserved
        bytes; growth over minutes is a leak) and garbage-collector pauses since start-up (count, total and longest
        by generation; `recent`: the latest as (perf_counter at start, ms, generation)), to line
        them up with a client's slowest requests."""
        return {"pid": os.getpid(), "memory": memory_now(self.clf.loaded.device), "gc": self.metrics.gc.summary()}

    async def check_health(self) -> None:
        """Serve calls this every serve.health_check_period_s; raising makes it replace the replica."""
        self.reloader.live()
        try:
            await self.worker.check()
        finally:
            self.metrics.health(self.worker.broken is None)

    def __del__(self):
        # Serve calls this once the replica has drained (in-flight requests answered)
        if getattr(self, "worker", None) is not None:
            self.worker.close()
        if getattr(self, "metrics", None) is not None:
            self.metrics.gc.close()
        if getattr(self, "predictions", None) is not None:
            self.predictions.close()  # the rows still queued are written

    def inject_fault(self, kind: str | None, query: str | None = None, seconds: float = 0.0,
                     path: str | None = None) -> int:
        """Tests only (serve.fault_injection=true): this replica's forwards broken, slowed or held on purpose
        (the kinds: qcls/testing/faults.py); None undoes. Returns this replica's process id (the tests kill
        replicas)."""
        if self.faults is None:
            raise PermissionError("fault injection is off: it needs serve.fault_injection=true (tests only)")
        self.faults.inject(self.clf, self.worker, kind, query, seconds, path)
        return os.getpid()


# Up to this many characters are tokenized on the event loop (well under a millisecond); a thread hop would cost
# more than it saves.
INLINE_CHARS = 4096


def deployment_options(cfg: QclsConfig) -> dict[str, Any]:
    s = cfg.serve
    opts: dict[str, Any] = {
        # runtime_env: the replica-side ingress flags (qcls/deployments/ingress.py: own HTTP port, user code on its
        # event loop, drain) travel with the app, also onto a cluster started without them (`serve run`, `serve deploy`)
        "ray_actor_options": {"num_gpus": s.num_gpus, "num_cpus": s.num_cpus,
                              "runtime_env": {"env_vars": serve_env(s)}},
        "max_ongoing_requests": cfg.max_ongoing_requests,
        "health_check_period_s": s.health_check_period_s,
        "health_check_timeout_s": s.health_check_timeout_s,
        "logging_config": {"enable_access_log": s.access_log},
    }
    if s.autoscaling:
        opts["autoscaling_config"] = autoscaling_config(s.autoscaling)
    else:
        opts["num_replicas"] = s.num_replicas
    return opts


def fault_injection(cfg: QclsConfig):
    """qcls.testing.faults where serve.fault_injection=true (tests only), else None."""
    if not cfg.serve.fault_injection:
        return None
    try:
        from qcls.testing import faults
    except ModuleNotFoundError as e:
        if e.name not in ("qcls.testing", "qcls.testing.faults"):
            raise
        raise ConfigError("serve.fault_injection=true needs qcls.testing, which ships with the source checkout "
                          "(tests and benchmarks) but not in the qcls wheel",
                          "serve.fault_injection=false, or serve from a checkout (pip install -e .)") from None
    return faults


def app_for(cfg: QclsConfig, overrides: list[str] | tuple[str, ...] = (), config_dir: Any = None,
            user_config: dict[str, Any] | None = None) -> Application:
    """The Serve application for a validated config. `overrides`/`config_dir`: what it was composed from, under a
    user_config's overrides (reload.py); `user_config`: the deployment's (None: the app's own config)."""
    if cfg.backend.device == "cuda" and cfg.serve.num_gpus == 0:
        raise ConfigError("backend.device=cuda but serve.num_gpus=0: a replica without a GPU sees none; set "
                          "serve.num_gpus=1 (one card per replica)")
    fault_injection(cfg)  # refused here, before a replica starts
    opts = deployment_options(cfg)
    if user_config is not None:
        opts["user_config"] = user_config
    base = {"overrides": list(overrides), "config_dir": config_dir}
    # Ray 2.60 keeps `version` for itself (`serve.run` draws a random one, which replaces every replica): set
    # through its internal flag, so that deploying again with a new user_config only reconfigures them
    deployment = QclsDeployment.options(**opts).options(_internal=True, version=deployment_version(cfg))
    return deployment.bind(portable(cfg), base)


def build_app(args: dict[str, Any]) -> Application:
    """Application builder for serve_config.yaml (`args: {overrides: [...], config_dir: DIR}`) and `serve run
    qcls.deployments.app:build_app key=value ...` (each key=value is a Hydra override). The config is composed
    here, where the builder runs (the machine `serve run` or the cluster's controller runs on), and the
    validated config object travels to every replica: `config_dir` must exist there, replicas never read it."""
    args = dict(args or {})
    overrides = args.pop("overrides", None) or []
    config_dir = args.pop("config_dir", None)
    if isinstance(overrides, str):
        overrides = overrides.split()
    overrides = [*overrides, *(f"{k}={v}" for k, v in args.items())]
    return app_for(compose(overrides, config_dir=config_dir), overrides, config_dir)
