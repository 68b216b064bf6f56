"""`qcls serve [hydra overrides]`: start (or join) Ray, deploy the app, and keep serving until Ctrl-C or
SIGTERM (both delete the app, which lets every replica finish its in-flight requests first). For Python callers of
a running app: `classifier_handle` (its DeploymentHandle with the cheaper serialization) and `direct_urls` (its
replicas' own HTTP addresses)."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

from qcls.config.compose import compose


def serve_main(overrides: list[str], blocking: bool = True, log_to_driver: bool | None = None):
    """Deploy qcls with the composed config. A Ray cluster named by RAY_ADDRESS is joined, else a local one
    starts. Non-blocking: returns the app's DeploymentHandle once every replica is ready. Blocking: serves
    until Ctrl-C, then deletes the app (and stops Ray if it started it here). Replica logs (load progress,
    one line per request) are echoed here when blocking, unless log_to_driver says otherwise.

    serve.ingress's Ray Serve flags (qcls/deployments/ingress.py) go into the environment of a Ray that
    starts here; a joined cluster keeps the flags it was started with (the replicas get theirs anyway)."""
    import ray
    from ray import serve

    from qcls.config.api_key import open_to_the_network
    from qcls.deployments.app import app_for
    from qcls.deployments.ingress import export_serve_env

    cfg = compose(overrides)
    s = cfg.serve
    app = app_for(cfg, overrides)  # refuses a config that cannot deploy (e.g. serve.autoscaling) before Ray starts
    if s.prediction_log.folder and not os.environ.get("RAY_ADDRESS"):  # (on a cluster: the replicas' nodes check)
        from qcls.predictions.log import check_folder
        check_folder(s.prediction_log)
    warning = open_to_the_network(s)  # (a bad key file is refused here, before Ray starts)
    if warning:
        print(f"[qcls] warning: {warning}", file=sys.stderr, flush=True)
    connected_here = not ray.is_initialized()
    # a cluster named by RAY_ADDRESS is joined, and left running (with its Serve) when this stops
    started_ray = connected_here and not os.environ.get("RAY_ADDRESS")
    if connected_here:
        if started_ray:
            export_serve_env(s)  # after importing ray.serve: see export_serve_env
        ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False,
                 log_to_driver=blocking if log_to_driver is None else log_to_driver,
                 **({"_metrics_export_port": s.metrics_export_port} if s.metrics_export_port else {}))
    serve.start(http_options={"host": s.host, "port": s.port})
    print(f"[qcls] deploying {cfg.model.name} ({s.num_replicas if not s.autoscaling else 'autoscaling'} "
          f"replica(s), {s.num_gpus:g} GPU each); ready once loaded and warmed …", file=sys.stderr, flush=True)
    try:
        handle = serve.run(app, name=s.app_name, route_prefix=s.route_prefix, blocking=False)
    except RuntimeError as e:  # a replica's start-up failed: its qcls message, not Serve's traceback text
        from qcls.errors import from_remote
        app = serve.status().applications.get(s.app_name)  # the replica's traceback is in its deployment's status
        text = "\n\n".join([str(e)] + ([d.message for d in app.deployments.values()] if app else []))
        clean = from_remote(text)
        if clean is None:
            raise
        raise clean from e
    base = f"http://{s.host}:{s.port}{s.route_prefix.rstrip('/')}"
    print(f"[qcls] playground: {base}/ (try queries, edit the prompts)", file=sys.stderr, flush=True)
    print(f"[qcls] serving: POST {base}/v1/classify · GET {base}/v1/prompts · GET {base}/healthz · "
          f"docs {base}/docs", file=sys.stderr, flush=True)
    if s.prediction_log.folder:
        print(f"[qcls] prediction log: {s.prediction_log.folder} (part-<replica>-<n>.{s.prediction_log.format}, "
              f"sample rate {s.prediction_log.sample_rate:g})", file=sys.stderr, flush=True)
    fast = direct_urls(s.app_name, s.host) if s.ingress == "direct" else []
    if fast:
        print(f"[qcls] fastest (each replica's own port, no proxy hop): {' '.join(fast)}; the address above "
              "routes over all replicas", file=sys.stderr, flush=True)
    node = getattr(ray._private.worker.global_worker, "node", None)
    if getattr(node, "metrics_export_port", None):
        print(f"[qcls] Prometheus metrics: http://{node.node_ip_address}:{node.metrics_export_port}/metrics",
              file=sys.stderr, flush=True)
    if not blocking:
        return handle
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("[qcls] stopping …", file=sys.stderr, flush=True)
    finally:
        serve.delete(s.app_name)
        if started_ray:
            serve.shutdown()
        if connected_here:
            ray.shutdown()
    return None


def direct_urls(app_name: str, host: str, wait_s: float = 3.0, n: int = 1) -> list[str]:
    """The replicas' own HTTP addresses (direct ingress, also behind HAProxy), from the target groups Serve's
    controller gives its proxy manager (it lists a new replica's port within a control-loop tick or two), once
    there are n of them or after wait_s; empty when this cluster's Serve controller runs without direct ingress.
    What `qcls serve` prints, and where a client that started the app (bench/load.py, the tests) sends its requests."""
    import ray
    from ray.serve.context import _get_global_client

    deadline, controller = time.monotonic() + wait_s, _get_global_client()._controller
    while True:
        # as the proxy manager asks: behind HAProxy, clients are told only HAProxy's address
        groups = ray.get(controller.get_target_groups.remote(app_name, True))
        # a replica's own port serves its app under the app's route prefix, as the proxy does (a group of an app
        # without running replicas lists Serve's proxies: not a replica)
        urls = [f"http://{t.ip if host in ('0.0.0.0', '::') else host}:{t.port}{g.route_prefix.rstrip('/')}"
                for g in groups if g.app_name == app_name and g.protocol == "HTTP"  # (a str enum)
                for t in g.targets if not t.name.startswith("SERVE_PROXY_ACTOR")]
        if len(urls) >= n or time.monotonic() > deadline:
            return urls
        time.sleep(0.2)


# Serve's handle calls cloudpickle their arguments and results by default; qcls's are plain lists, strings
# and dataclasses (qcls.results), which the standard pickle writes at a fraction of the cost (bench/RESULTS.md)
HANDLE_SERIALIZATION = {"request_serialization": "pickle", "response_serialization": "pickle"}


def classifier_handle(app_name_or_handle: str | Any = "qcls"):
    """The DeploymentHandle of a running qcls app (or the handle given, e.g. serve_main's), with the cheaper
    serialization (HANDLE_SERIALIZATION). Call it where the calls are made: this sets up the handle's router,
    which in a process with RAY_SERVE_THROUGHPUT_OPTIMIZED=1 must happen inside the caller's event loop."""
    from ray import serve

    handle = serve.get_app_handle(app_name_or_handle) if isinstance(app_name_or_handle, str) else app_name_or_handle
    return handle.options(**HANDLE_SERIALIZATION)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")
