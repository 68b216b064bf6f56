"""The Ray Serve deployment: one replica = one `Classifier` on one device, concurrent queries batched into one
`classify` call (one forward).

    serve run serve_config.yaml                                   # the app as configured there
    serve run qcls.deployments.app:build_app model=qwen3_4b serve.num_gpus=1
    qcls serve model=qwen3_4b serve.num_gpus=1                    # the same from qcls's CLI

Python callers use a DeploymentHandle; `classify` returns the `qcls.results.QueryResult` dataclasses that
`Classifier.classify` returns, with `timings_ms` gaining queue_wait and in_replica:

    handle = serve.get_app_handle("qcls")
    results = handle.classify.remote(["red hoodie", "maxi dress"]).result()
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

from ray import serve
from ray.serve import Application

from qcls.classifier import Classifier
from qcls.compose import ConfigError, compose
from qcls.config import QclsConfig
from qcls.deployments.http import build_http_app
from qcls.deployments.worker import EngineWorker, Pending, refused
from qcls.results import QueryResult

INJECTED_CUDA_ERROR = "CUDA error: an illegal memory access was encountered (injected by inject_fault)"


@serve.deployment(name="QclsClassifier")
@serve.ingress()
class QclsDeployment:
    def __init__(self, cfg: QclsConfig):
        # Everything loads, captures and warms here: Serve marks the replica ready only once this returns.
        self.cfg = cfg
        self.clf = Classifier(cfg)
        self.worker = EngineWorker(self.clf, probe_idle_s=cfg.serve.health_probe_idle_s,
                                   probe_timeout_s=0.8 * cfg.serve.health_check_timeout_s)
        # The decorator's sizes are placeholders; the config's engine batch is what one forward can take.
        self._batched.set_max_batch_size(cfg.engine.max_batch_size)
        self._batched.set_batch_wait_timeout_s(cfg.serve.batch_wait_timeout_s)

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
            raise ValueError(f"{len(queries)} queries, over max_queries_per_request="
                             f"{self.cfg.max_queries_per_request}: split them over several calls")
        refusals = await self.worker.refusals(list(queries))

        async def one(query: str, refusal: str | None) -> QueryResult:
            if refusal is not None:
                return refused(query, refusal)
            r = await (await self._batched(Pending(query, arrived)))
            r.timings_ms["in_replica"] = round((time.perf_counter() - arrived) * 1e3, 4)
            return r

        return list(await asyncio.gather(*(one(q, w) for q, w in zip(queries, refusals))))

    def prompts(self) -> list[dict[str, Any]]:
        return [{"name": p.name, "labels": list(p.labels)} for p in self.cfg.prompts]

    def metadata(self) -> dict[str, Any]:
        return self.clf.metadata()

    async def check_health(self) -> None:
        """Serve calls this every serve.health_check_period_s; raising makes it replace the replica."""
        await self.worker.check()

    def inject_fault(self, kind: str | None, query: str | None = None) -> None:
        """Tests only (serve.fault_injection=true). kind="engine": every forward raises a CUDA-like error;
        "poison": only batches holding `query` raise; None: undo."""
        if not self.cfg.serve.fault_injection:
            raise PermissionError("fault injection is off: it needs serve.fault_injection=true (tests only)")
        for obj, name in ((self.clf.engine, "run"), (self.clf, "classify")):
            obj.__dict__.pop(name, None)
        if kind == "engine":
            def broken_run(*_a, **_k):
                raise RuntimeError(INJECTED_CUDA_ERROR)
            self.clf.engine.run = broken_run
        elif kind == "poison":
            real = self.clf.classify

            def poisoned(queries: list[str]) -> list[QueryResult]:
                if query in queries:
                    raise RuntimeError(f"injected failure on {query!r}")
                return real(queries)
            self.clf.classify = poisoned
        elif kind is not None:
            raise ValueError(f"unknown fault {kind!r}: use 'engine', 'poison' or None")


def deployment_options(cfg: QclsConfig) -> dict[str, Any]:
    s = cfg.serve
    opts: dict[str, Any] = {
        "ray_actor_options": {"num_gpus": s.num_gpus, "num_cpus": s.num_cpus},
        "max_ongoing_requests": cfg.max_ongoing_requests,
        "health_check_period_s": s.health_check_period_s,
        "health_check_timeout_s": s.health_check_timeout_s,
    }
    if s.autoscaling:
        opts["autoscaling_config"] = dict(s.autoscaling)
    else:
        opts["num_replicas"] = s.num_replicas
    return opts


def app_for(cfg: QclsConfig) -> Application:
    """The Serve application for a validated config."""
    if cfg.backend.device == "cuda" and cfg.serve.num_gpus == 0:
        raise ConfigError("backend.device=cuda but serve.num_gpus=0: a replica without a GPU sees none; set "
                          "serve.num_gpus=1 (one card per replica)")
    return QclsDeployment.options(**deployment_options(cfg)).bind(cfg)


def build_app(args: dict[str, Any]) -> Application:
    """Application builder for serve_config.yaml (`args: {overrides: [...]}`) and `serve run
    qcls.deployments.app:build_app key=value ...` (each key=value is a Hydra override)."""
    args = dict(args or {})
    overrides = args.pop("overrides", None) or []
    if isinstance(overrides, str):
        overrides = overrides.split()
    return app_for(compose([*overrides, *(f"{k}={v}" for k, v in args.items())]))
