"""The `eval` group: composed with the sweep config, validated on its own, stripped before QclsConfig."""
from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from qcls.config.compose import ConfigError, conf_dir
from qcls.eval.dataset import DatasetError
from qcls.eval.spec import EvalSpec, named_split, resolve_path, split_config


def sweep_cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return compose(config_name="sweep", overrides=overrides)


def test_sweep_config_composes_eval_and_the_normal_config():
    cfg = sweep_cfg(["eval=test", "eval.path=/some/file.jsonl", "scoring=exact", "prompts=ecommerce8"])
    spec, qcfg = split_config(cfg)
    assert spec.path == "/some/file.jsonl" and spec.fit_on == "data/eval/ecommerce_dev.jsonl"
    assert qcfg.strategy == "exact" and len(qcfg.prompts) == 8
    dev, _ = split_config(sweep_cfg([]))
    assert dev == named_split("dev") and dev.fit_on is None and dev.batch1_queries == 32
    assert dev.agreement_with_exact is True


def test_unknown_or_bad_eval_keys_are_refused():
    with pytest.raises(ConfigError, match=r"eval\.bogus"):
        split_config(sweep_cfg(["+eval.bogus=1"]))
    with pytest.raises(ConfigError, match=r"eval\.limit"):
        split_config(sweep_cfg(["eval.limit=0"]))
    with pytest.raises(ConfigError, match="eval.fit_method='platt'"):
        split_config(sweep_cfg(["eval.fit_method=platt"]))
    with pytest.raises(ConfigError, match="no `eval` group"):
        split_config({"model": {"name": "x", "source": "demo"}})
    with pytest.raises(ConfigError, match="no eval split 'nope'"):
        named_split("nope")


def test_paths_resolve_against_cwd_then_the_package(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text("# a file of the same name in the cwd wins\n")
    assert resolve_path("pyproject.toml") == (tmp_path / "pyproject.toml").resolve()
    assert resolve_path("conf/config.yaml") == (conf_dir() / "config.yaml").resolve()  # shipped: the package
    assert resolve_path(str(tmp_path / "pyproject.toml")) == (tmp_path / "pyproject.toml").resolve()
    with pytest.raises(DatasetError, match=r"eval.path='nope.jsonl': no such file"):
        resolve_path("nope.jsonl")


def test_evalspec_defaults():
    s = EvalSpec(path="x.jsonl")
    assert (s.limit, s.fit_on, s.batch1_queries, s.agreement_with_exact) == (None, None, 32, True)
