"""serve.autoscaling, checked against Ray Serve's own AutoscalingConfig where the config is validated
(compose.validate) rather than when Serve deploys it, which ignores a misspelt key. Ray is imported only for a
config that sets serve.autoscaling, and only where it is installed."""
from __future__ import annotations

import importlib.util

from typing import Any

from pydantic import ValidationError

from qcls.errors import ConfigError


def ray_serve_installed() -> bool:
    try:
        return importlib.util.find_spec("ray.serve") is not None
    except ModuleNotFoundError:  # no `ray` at all
        return False


def autoscaling_config(given: dict[str, Any]) -> dict[str, Any]:
    """serve.autoscaling as Ray Serve's autoscaling_config, or a ConfigError that names the key or the field."""
    from ray.serve.config import AutoscalingConfig

    fields = sorted(AutoscalingConfig.model_fields)
    unknown = sorted(set(given) - set(fields))
    if unknown:
        raise ConfigError(f"serve.autoscaling: unknown key(s) {', '.join(unknown)}",
                          f"Ray Serve's autoscaling_config takes: {', '.join(fields)}")
    try:
        AutoscalingConfig(**given)
    except (ValidationError, TypeError, ValueError) as e:
        why = ("; ".join(f"{'.'.join(map(str, x['loc'])) or 'value'}: {x['msg']}" for x in e.errors())
               if isinstance(e, ValidationError) else str(e))
        raise ConfigError(f"serve.autoscaling={dict(given)} is not a valid Ray Serve autoscaling_config: {why}",
                          "e.g. serve.autoscaling={min_replicas:1,max_replicas:4,target_ongoing_requests:8}") from None
    return dict(given)
