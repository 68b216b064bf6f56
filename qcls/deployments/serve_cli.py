"""`qcls serve [hydra overrides]`: start (or join) Ray, deploy the app, and keep serving until Ctrl-C."""
from __future__ import annotations

import os
import sys
import time

from qcls.compose import compose


def serve_main(overrides: list[str], blocking: bool = True, log_to_driver: bool | None = None):
    """Deploy qcls with the composed config. A Ray cluster named by RAY_ADDRESS is joined, else a local one
    starts. Non-blocking: returns the app's DeploymentHandle once every replica is ready. Blocking: serves
    until Ctrl-C, then deletes the app (and stops Ray if it started it here). Replica logs (load progress,
    one line per request) are echoed here when blocking, unless log_to_driver says otherwise."""
    import ray
    from ray import serve

    from qcls.deployments.app import app_for

    cfg = compose(overrides)
    s = cfg.serve
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False,
                 log_to_driver=blocking if log_to_driver is None else log_to_driver)
    serve.start(http_options={"host": s.host, "port": s.port})
    print(f"[qcls] deploying {cfg.model.name} ({s.num_replicas if not s.autoscaling else 'autoscaling'} "
          f"replica(s), {s.num_gpus:g} GPU each); ready once loaded and warmed …", file=sys.stderr, flush=True)
    handle = serve.run(app_for(cfg), name=s.app_name, route_prefix=s.route_prefix, blocking=False)
    base = f"http://{s.host}:{s.port}{s.route_prefix.rstrip('/')}"
    print(f"[qcls] serving: POST {base}/v1/classify · GET {base}/v1/prompts · GET {base}/healthz · "
          f"docs {base}/docs", file=sys.stderr, flush=True)
    if not blocking:
        return handle
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("[qcls] stopping …", file=sys.stderr, flush=True)
    finally:
        serve.delete(s.app_name)
        if started_ray:
            serve.shutdown()
            ray.shutdown()
    return None
