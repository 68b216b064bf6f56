"""serve.autoscaling is checked against Ray Serve's AutoscalingConfig where the config is composed: a misspelt key
or a bad value is refused naming it, before anything deploys (Serve itself would ignore the misspelt key)."""
from __future__ import annotations

import pytest

from qcls.config.compose import ConfigError, compose


def test_a_bad_autoscaling_config_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match="unknown key.*max_replica\\b.*\n.*max_replicas"):
        compose(["serve.autoscaling={min_replicas:1,max_replica:4}"])
    with pytest.raises(ConfigError, match="must be greater than or equal to min_replicas"):
        compose(["serve.autoscaling={min_replicas:4,max_replicas:2}"])
    assert compose(["serve.autoscaling={min_replicas:1,max_replicas:4}"]).serve.autoscaling == {
        "min_replicas": 1, "max_replicas": 4}


def test_without_ray_serve_autoscaling_does_not_block_composing(monkeypatch):
    """A machine without Ray still composes a config whose serve.autoscaling is set (to classify or check with it);
    the check runs where the app is built, which needs Ray."""
    from qcls.config import autoscaling

    monkeypatch.setattr(autoscaling, "ray_serve_installed", lambda: False)
    cfg = compose(["serve.autoscaling={min_replicas:1,max_replica:4}"])
    assert cfg.serve.autoscaling == {"min_replicas": 1, "max_replica": 4}
    with pytest.raises(ConfigError, match="unknown key.*max_replica\\b"):
        autoscaling.autoscaling_config(cfg.serve.autoscaling)  # as deployment_options calls it
