"""What a reload may change: the rules that tell a configuration a running deployment can take in place (a new
prompt set, head file, scoring or limits on the weights its replicas hold) from one that needs a new deployment,
and the configuration a deployment's user_config asks for. The replica's side: qcls/deployments/reload.py (requests
and outcome), EngineWorker.reload in qcls/deployments/worker.py (build beside the serving one, swap, memory given
back); `qcls reload` is qcls/cli/reload.py.

Serve hands a replica its deployment's `user_config` in two forms:

    {"overrides": ["prompts=ecommerce8_fewshot", "calibration=null"]}   # Hydra overrides on top of the app's own
    {"config": {...}, "id": "..."}                                      # a composed config (what `qcls reload` sends)
"""
from __future__ import annotations

import hashlib
import json

from pydantic import ValidationError

from qcls.config.schema import QclsConfig
from qcls.errors import ConfigError

# What a reload cannot change: the weights (model, backend, memory budget, conversion cache) and the deployment's
# shape (serve.*: replicas, GPUs, ports; engine.max_batch_size: the batcher's size)
NEEDS_NEW_DEPLOYMENT = ("model", "backend", "gpu_memory_gib", "cache_dir", "serve", "engine.max_batch_size")


def redacted(cfg: QclsConfig) -> QclsConfig:
    """The config with serve.api_key replaced by its hash: comparable (a reload that drops or changes the key is a
    serve change) without the key leaving the replica."""
    if cfg.serve.api_key is None:
        return cfg
    digest = "sha256:" + hashlib.sha256(cfg.serve.api_key.encode("utf-8")).hexdigest()
    return cfg.model_copy(update={"serve": cfg.serve.model_copy(update={"api_key": digest})})


def deployment_version(cfg: QclsConfig) -> str:
    """The NEEDS_NEW_DEPLOYMENT settings, hashed: the app's Serve version, so that deploying it again with only
    another user_config (`qcls reload`) reconfigures the running replicas in place instead of replacing them."""
    dump = cfg.model_dump(mode="json", exclude={"serve": {"api_key"}})
    parts = {k: (dump["engine"]["max_batch_size"] if k == "engine.max_batch_size" else dump[k])
             for k in NEEDS_NEW_DEPLOYMENT}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def changed_keys(old: QclsConfig, new: QclsConfig) -> list[str]:
    """The NEEDS_NEW_DEPLOYMENT settings that differ between the two configurations."""
    out = []
    for key in NEEDS_NEW_DEPLOYMENT:
        a, b = old, new
        for part in key.split("."):
            a, b = getattr(a, part), getattr(b, part)
        if a != b:
            out.append(key)
    return out


def target_config(user_config: dict | None, base: dict, current: QclsConfig) -> QclsConfig:
    """The configuration a user_config asks for. `base`: the app's own {"overrides", "config_dir"}; a config
    without `serve` keeps the replica's serving settings."""
    from qcls.config.compose import compose

    uc = dict(user_config or {})
    uc.pop("id", None)
    unknown = sorted(set(uc) - {"overrides", "config", "config_dir"})
    if unknown or ("config" in uc and "overrides" in uc):
        raise ConfigError(f"user_config keys {sorted(user_config or {})}: give either `overrides` (a list of Hydra "
                          "overrides on top of the app's own, and optionally `config_dir`) or `config`",
                          'e.g. user_config: {overrides: ["prompts=ecommerce8_fewshot"]}')
    if "config" in uc:
        given = dict(uc["config"])
        given.setdefault("serve", current.serve.model_dump(mode="json"))
        try:
            return QclsConfig.model_validate(given)
        except ValidationError as e:
            raise ConfigError(f"the configuration in user_config is invalid: {e}",
                              "compose it with `qcls reload` (the same overrides as `qcls serve`)") from None
    overrides = uc.get("overrides") or []
    if isinstance(overrides, str):
        overrides = overrides.split()
    return compose([*base.get("overrides", []), *overrides],
                   config_dir=uc.get("config_dir") or base.get("config_dir"))
