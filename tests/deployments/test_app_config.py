"""serve_config.yaml and the app builder, checked without starting Ray."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

from qcls.config.compose import ConfigError, compose

ROOT = Path(__file__).resolve().parents[2]


def test_serve_config_yaml_is_a_valid_serve_config_for_the_builder():
    from ray.serve.schema import ServeDeploySchema

    raw = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    schema = ServeDeploySchema.model_validate(raw)
    [app] = schema.applications
    assert app.import_path == "qcls.deployments.app:build_app"
    compose(app.args["overrides"])  # the overrides it ships compose and validate


def test_builder_maps_config_to_deployment_options():
    from ray.serve import Application

    from qcls.deployments.app import build_app, deployment_options

    app = build_app({"overrides": ["serve.num_replicas=3"], "serve.num_gpus": "1", "engine.max_batch_size": 4})
    assert isinstance(app, Application)
    cfg = compose(["serve.num_replicas=3", "serve.num_gpus=1", "engine.max_batch_size=4"])
    opts = deployment_options(cfg)
    actor = opts["ray_actor_options"]
    assert opts["num_replicas"] == 3 and (actor["num_gpus"], actor["num_cpus"]) == (1.0, 1.0)
    # the replica-side ingress flags travel with the app (serve run / serve deploy onto any cluster)
    assert actor["runtime_env"]["env_vars"]["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"
    assert "RAY_SERVE_THROUGHPUT_OPTIMIZED" not in deployment_options(
        compose(["serve.ingress=proxy"]))["ray_actor_options"]["runtime_env"]["env_vars"]
    assert opts["max_ongoing_requests"] == 64  # waiting queries queue in the replica, not in Serve's router
    auto = deployment_options(compose(["serve.autoscaling={min_replicas:1,max_replicas:4}"]))
    assert auto["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4} and "num_replicas" not in auto
    # Serve's per-request access log is off unless asked for; log records are written one at a time
    assert opts["logging_config"] == {"enable_access_log": False}
    assert deployment_options(compose(["serve.access_log=true"]))["logging_config"] == {"enable_access_log": True}
    assert actor["runtime_env"]["env_vars"]["RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE"] == "1"


def test_inconsistent_serving_configs_are_refused():
    from qcls.deployments.app import app_for

    with pytest.raises(ConfigError, match="max_ongoing_requests=2 is below engine.max_batch_size=4"):
        compose(["engine.max_batch_size=4", "serve.max_ongoing_requests=2"])
    with pytest.raises(ConfigError, match="serve.num_gpus=0"):
        app_for(compose(["backend.device=cuda"]))
    with pytest.raises(ConfigError, match="serve.bogus"):
        compose(["+serve.bogus=1"])


def docs_serving() -> str:
    return (ROOT / "docs" / "serving.md").read_text()


def test_the_documented_autoscaling_config_is_valid_for_ray_serve():
    from ray.serve.config import AutoscalingConfig

    from qcls.deployments.app import deployment_options

    examples = re.findall(r"'(serve\.autoscaling=\{[^']*\})'", docs_serving())
    assert examples, "docs/serving.md has no serve.autoscaling example"
    for example in examples:
        opts = deployment_options(compose(["serve.num_gpus=1", example]))
        cfg = AutoscalingConfig(**opts["autoscaling_config"])
        assert cfg.min_replicas <= cfg.max_replicas and "num_replicas" not in opts, example


def test_the_documented_cluster_config_is_a_valid_serve_config_for_the_builder():
    from ray.serve.schema import ServeDeploySchema

    from qcls.deployments.app import deployment_options

    # the cluster config (the reload example beside it is checked by the reload tests)
    [block] = [b for b in re.findall(r"```yaml\n(.*?)```", docs_serving(), re.S)
               if "build_app" in b and "user_config" not in b]
    [app] = ServeDeploySchema.model_validate(yaml.safe_load(block)).applications
    assert app.import_path == "qcls.deployments.app:build_app"
    opts = deployment_options(compose(app.args["overrides"]))
    assert opts["num_replicas"] == 4 and opts["ray_actor_options"]["num_gpus"] == 1


def test_fault_injection_needs_the_checkouts_testing_package(monkeypatch):
    from qcls.deployments.app import app_for, fault_injection
    from qcls.testing import faults

    assert fault_injection(compose([])) is None  # off: qcls.testing is never looked for
    on = compose(["serve.fault_injection=true"])
    assert fault_injection(on) is faults
    monkeypatch.setitem(sys.modules, "qcls.testing", None)  # as where the wheel is installed: it leaves it out
    with pytest.raises(ConfigError, match="needs qcls.testing") as e:
        app_for(on)
    assert e.value.way_out.startswith("serve.fault_injection=false")
