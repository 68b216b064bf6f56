"""Registry and config group: every backend is one name, one module, one conf/backend file."""
from __future__ import annotations

import importlib

import pytest

from qcls.backends.base import Backend
from qcls.backends.registry import BACKENDS, get_backend
from qcls.config.compose import ConfigError, compose
from tests.backends.helpers import cfg


def test_unknown_backend_lists_known():
    with pytest.raises(ValueError) as e:
        get_backend("fp8")
    for name in ("fp16", "fp16-offload", "bnb-int8", "bnb-nf4", "gptq"):
        assert name in str(e.value)


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_backend_imports_and_has_a_config_file(name):
    module, cls = BACKENDS[name].split(":")
    backend = getattr(importlib.import_module(module), cls)()
    assert isinstance(backend, Backend) and backend.name == name
    c = compose([f"backend={name}"])
    assert c.backend.name == name


def test_unknown_config_group_option_names_the_choices():
    with pytest.raises(ConfigError) as e:
        compose(["backend=int3"])
    assert "fp16-offload" in str(e.value) and "bnb-nf4" in str(e.value)


def test_gpu_t4_profile_sets_the_budget():
    assert compose(["gpu=t4"]).gpu_memory_gib == 15.0
    assert compose([]).gpu_memory_gib is None
    assert compose(["gpu=t4", "gpu_memory_gib=12"]).gpu_memory_gib == 12.0


def test_backend_options_from_overrides():
    c = compose(["backend=bnb-int8", "backend.options.threshold=0"])
    assert c.backend.options == {"threshold": 0}
    c = compose(["backend=fp16-offload", "backend.options.full_head=true"])
    assert c.backend.options["full_head"] is True and c.backend.options["offload_layers"] == "auto"


@pytest.mark.parametrize("name", ["fp16-offload", "bnb-int8", "bnb-nf4", "gptq"])
def test_unknown_backend_option_is_an_error(name, tiny_dirs):
    c = cfg(tiny_dirs["qwen3"], name, {"treshold": 1})
    with pytest.raises(ValueError) as e:  # checked before any library import or weight read
        get_backend(name).load(c)
    assert "treshold" in str(e.value) and "known" in str(e.value)
