"""Config validation: every refusal names the field and the reason; Hydra composition with overrides."""
from __future__ import annotations

import pytest

from qcls.config.compose import ConfigError, compose, validate
from tests.conftest import prompt


def _cfg(**kw):
    data = {"model": {"name": "m", "source": "demo"}, "prompts": [prompt("a", ["x", "y"])]}
    data.update(kw)
    return validate(data)


def test_default_composition_is_the_mission():
    cfg = compose([])
    assert cfg.model.source == "demo" and cfg.backend.name == "auto" and cfg.strategy == "trie"
    assert [p.name for p in cfg.prompts] == ["category", "audience"]
    assert cfg.prompts[0].labels[-1] == "none" and "pregnant" in cfg.prompts[1].labels
    assert cfg.prompts[0].template.count("{query}") == 1 and cfg.prompts[0].label_prefix == " "


def test_overrides_compose():
    cfg = compose(["model=qwen3_4b", "scoring=exact", "prompts=ecommerce8", "engine.max_batch_size=2",
                   "force_single_token_labels=true"])
    assert cfg.model.path == "Qwen/Qwen3-4B" and cfg.scoring.name == "exact"
    assert len(cfg.prompts) == 8 and cfg.engine.max_batch_size == 2
    assert cfg.strategy == "first_token"  # force_single_token_labels wins over the scoring group


@pytest.mark.parametrize("template,msg", [("no placeholder", "exactly one '{query}'"),
                                          ("{query} and {query}", "found 2")])
def test_template_needs_one_query(template, msg):
    with pytest.raises(ConfigError, match="prompts.0.template") as e:
        _cfg(prompts=[{"name": "a", "template": template, "labels": ["x", "y"]}])
    assert msg in str(e.value)


@pytest.mark.parametrize("labels,msg", [(["x", " "], "empty"), (["x", "x", "y"], "duplicate labels"),
                                        (["x"], "at least 2 labels")])
def test_bad_labels(labels, msg):
    with pytest.raises(ConfigError, match="prompts.0.labels") as e:
        _cfg(prompts=[prompt("a", labels)])
    assert msg in str(e.value)


def test_prompt_count_and_names():
    with pytest.raises(ConfigError, match="at least one prompt"):
        _cfg(prompts=[])
    with pytest.raises(ConfigError, match="at most 16"):
        _cfg(prompts=[prompt(f"p{i}", ["x", "y"]) for i in range(17)])
    with pytest.raises(ConfigError, match="duplicate prompt names"):
        _cfg(prompts=[prompt("a", ["x", "y"]), prompt("a", ["u", "v"])])


def test_unknown_keys_refused():
    with pytest.raises(ConfigError, match="typo_key"):
        _cfg(typo_key=1)
    with pytest.raises(ConfigError, match="scoring.bogus"):
        _cfg(scoring={"name": "trie", "bogus": 1})
    with pytest.raises(ConfigError, match="bad override"):
        compose(["nonexistent_group=foo"])


def test_unknown_strategy_and_bucket_limit():
    with pytest.raises(ConfigError, match="scoring.name"):
        _cfg(scoring={"name": "greedy"})
    with pytest.raises(ConfigError, match="max_query_tokens=100 exceeds the largest query bucket 64"):
        _cfg(max_query_tokens=100)


def test_model_path_required():
    with pytest.raises(ConfigError, match="model.path is required"):
        _cfg(model={"name": "m", "source": "local"})
