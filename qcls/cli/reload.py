"""`qcls reload [--config-dir DIR] [hydra overrides]`: give a running `qcls serve` (or any running qcls app) a new
prompt set, head file, scoring or limits without a restart.

The overrides are the whole configuration, as for `qcls serve` (the same ones with the changes): composed and
checked here first (a typo, a head file that does not fit the prompts), compared with the configuration the app
serves (a change of model, backend or serving settings needs a new deployment and is refused: qcls/config/reloads.py),
then sent as the deployment's user_config: Serve calls every replica's reconfigure(), each builds the new
configuration beside the serving one and swaps (qcls/deployments/reload.py, EngineWorker.reload). The command waits
until every replica serves it or one refused it; a refusal rolls the deployment's target back to the configuration
still serving, and exits 2 with the reason.
"""
from __future__ import annotations

import os
import sys
import time
import uuid

from qcls.config.compose import compose
from qcls.config import QclsConfig
from qcls.errors import ConfigError

DEPLOYMENT = "QclsClassifier"


def reload_main(overrides: list[str], wait_s: float = 900.0) -> int:
    if "ray.serve" not in sys.modules:  # a shell with Serve's flags exported: this process's handle stays synchronous
        os.environ.pop("RAY_SERVE_THROUGHPUT_OPTIMIZED", None)
    import ray
    from ray import serve

    from qcls.config.reloads import changed_keys, redacted
    from qcls.deployments.app import app_for
    from qcls.deployments.reload import RefusedReload
    from qcls.heads.startup import choose, portable

    cfg = compose(overrides)
    choose(cfg)  # a head file that does not fit these prompts: refused before anything is sent
    s = cfg.serve
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), log_to_driver=False)
    try:
        handle = serve.get_app_handle(s.app_name)
        running = QclsConfig.model_validate(handle.active_config.remote().result())
    except (ConfigError, RefusedReload):
        raise
    except Exception as e:  # noqa: BLE001 - no such app, no Serve, an older qcls
        raise ConfigError(f"no running qcls app {s.app_name!r} answered on this Ray cluster ({type(e).__name__}: "
                          f"{e})", "start it with `qcls serve …` (or name it: serve.app_name=NAME; another "
                          "cluster: RAY_ADDRESS)") from None
    keys = changed_keys(running, redacted(portable(cfg)))  # head paths and the key as the replicas hold them
    if keys:
        raise RefusedReload(f"the new configuration changes {', '.join(keys)}, which a reload cannot: they need "
                            "other weights or another deployment shape",
                            "deploy it anew: stop `qcls serve` and start it with these overrides")
    request_id = uuid.uuid4().hex[:12]
    states = _deploy(serve, app_for(cfg, overrides, user_config=_user_config(cfg, request_id)), s, handle,
                     request_id, wait_s)
    refused = [st for st in states if st["status"] == "refused"]
    if refused:  # the deployment's target goes back to what still serves, so a replacement replica starts on it
        back = running.model_copy(update={"serve": cfg.serve})  # the same serve part, with the key itself
        _deploy(serve, app_for(back, user_config=_user_config(back, uuid.uuid4().hex[:12])), s, handle, None, wait_s)
        raise RefusedReload(f"reload refused by replica {refused[0]['replica']}: {refused[0]['detail']}",
                            f"every replica still serves configuration {refused[0]['fingerprint']} (prompts "
                            f"{', '.join(refused[0]['prompts'])})")
    st = states[0]
    print(f"[qcls] reloaded: {len(states)} replica(s) serve configuration {st['fingerprint']} (prompts "
          f"{', '.join(st['prompts'])})", file=sys.stderr, flush=True)
    return 0


def _user_config(cfg: QclsConfig, request_id: str) -> dict:
    """Without `serve`: the replicas keep theirs, and no API key travels in the deployment's (visible) config.
    Head files found relative to this directory are made absolute (replicas run in a directory of Ray's)."""
    from qcls.heads.startup import portable
    return {"config": portable(cfg).model_dump(mode="json", exclude={"serve"}), "id": request_id}


def _deploy(serve, app, s, handle, request_id: str | None, wait_s: float) -> list[dict]:
    """Deploy `app` (same version: Serve reconfigures the running replicas) and, with a request_id, wait until
    every running replica has built or refused it; returns their states."""
    serve.run(app, name=s.app_name, route_prefix=s.route_prefix, blocking=False)
    if request_id is None:
        return []
    status = serve.status().applications[s.app_name].deployments[DEPLOYMENT]
    replicas = max(1, int(status.replica_states.get("RUNNING", 1)))
    seen: dict[str, dict] = {}
    deadline = time.monotonic() + wait_s
    while len(seen) < replicas:  # each call reaches one replica: until every one has answered
        left = deadline - time.monotonic()
        st = handle.reload_outcome.remote(request_id, max(0.0, min(left, 5.0))).result() if left > 0 else None
        if st is not None:
            seen[st["replica"]] = st
        elif time.monotonic() > deadline:
            raise TimeoutError(f"{len(seen)} of {replicas} replica(s) finished the reload within {wait_s:g} s; "
                               "GET /v1/prompts shows each replica's state")
    return list(seen.values())
