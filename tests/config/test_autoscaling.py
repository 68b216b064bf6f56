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
