"""`qcls serve [hydra overrides]`: start (or join) Ray, deploy the app, and keep serving until Ctrl-C or
SIGTERM (both delete the app, which lets every replica finish its in-flight requests first)."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

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

    from qcls.deployments.app import app_for
    from qcls.deployments.ingress import direct_urls, export_serve_env

    from qcls.deployments.api_key import open_to_the_network

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


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")
