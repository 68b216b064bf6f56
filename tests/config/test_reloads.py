"""What a reload may change (qcls/config/reloads.py): the settings that need a new deployment, the API key compared by
its hash, the Serve version that stays while only reloadable settings change, and the configuration a user_config
asks for."""
from __future__ import annotations

import pytest

from qcls.config.compose import ConfigError, compose
from qcls.config.reloads import changed_keys, deployment_version, redacted, target_config


def test_what_a_reload_cannot_change():
    base = compose([])
    assert changed_keys(base, compose(["prompts=default_fewshot", "calibration=null", "scoring=exact",
                                       "max_query_tokens=32", "engine.result_cache_entries=5"])) == []
    assert changed_keys(base, compose(["model=smollm2_demo"])) == ["model"]
    assert changed_keys(base, compose(["backend.dtype=float16", "serve.port=9000", "engine.max_batch_size=8"])) == [
        "backend", "serve", "engine.max_batch_size"]


def test_a_redacted_config_compares_keys_without_holding_them():
    keyed = redacted(compose(["serve.api_key=s3cret"]))
    assert "s3cret" not in keyed.model_dump_json() and keyed.serve.api_key.startswith("sha256:")
    assert keyed == redacted(compose(["serve.api_key=s3cret"])) and redacted(compose([])) == compose([])
    assert changed_keys(keyed, redacted(compose(["serve.api_key=other"]))) == ["serve"]
    assert changed_keys(keyed, redacted(compose([]))) == ["serve"]


def test_the_serve_version_stays_while_only_reloadable_settings_change():
    v = deployment_version(compose([]))
    assert deployment_version(compose(["prompts=default_fewshot", "calibration=null", "serve.api_key=k"])) == v
    assert deployment_version(compose(["model=smollm2_demo"])) != v
    assert deployment_version(compose(["serve.num_replicas=2"])) != v


def test_a_user_config_is_overrides_on_the_apps_own_or_a_whole_config():
    current = compose(["serve.port=9001", "max_query_tokens=32"])
    base = {"overrides": ["serve.port=9001", "max_query_tokens=32"]}
    got = target_config({"overrides": ["prompts=default_fewshot"]}, base, current)
    assert got == compose(["serve.port=9001", "max_query_tokens=32", "prompts=default_fewshot"])
    assert target_config(None, base, current) == current  # no user_config: the app's own
    whole = compose(["prompts=default_fewshot"]).model_dump(mode="json", exclude={"serve"})
    assert target_config({"config": whole, "id": "x"}, base, current).serve == current.serve  # keeps its serve
    with pytest.raises(ConfigError, match="give either `overrides`"):
        target_config({"prompt": ["x"]}, base, current)
    with pytest.raises(ConfigError, match="invalid"):
        target_config({"config": {**whole, "max_query_tokens": -1}}, base, current)
    with pytest.raises(ConfigError):
        target_config({"overrides": ["prompts=no_such_set"]}, base, current)
