"""Registry and config group: every backend is one name, one module, one conf/backend file."""
from __future__ import annotations

import importlib

import pytest
import torch

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


def test_the_default_backend_is_int8_on_a_cpu_and_fp16_on_a_gpu():
    from qcls.backends.registry import resolved_name
    c = compose([])
    assert c.backend.name == "auto" and c.backend.options == compose(["backend=int8"]).backend.options
    assert resolved_name(c, torch.device("cpu")) == "int8" and resolved_name(c, torch.device("cuda")) == "fp16"
    assert resolved_name(compose(["backend=fp16"]), torch.device("cpu")) == "fp16"
    assert resolved_name(compose(["backend.device=cpu"])) == "int8"  # the device it resolves to


def test_int8_options_of_auto_on_a_gpu_are_refused_with_the_way_out():
    from qcls.backends.registry import resolved_name
    c = compose(["backend.options.calibration_tokens=1024"])
    assert resolved_name(c, torch.device("cpu")) == "int8"
    with pytest.raises(ConfigError, match=r"\['calibration_tokens'\] are int8's") as e:
        resolved_name(c, torch.device("cuda"))
    assert "backend=int8" in e.value.way_out


def test_auto_on_the_cpu_loads_int8_with_its_options(tiny_dirs):
    from qcls.backends.registry import backend_for
    from qcls.classifier import Classifier
    c = cfg(tiny_dirs["qwen3"], "auto", {"calibration_tokens": 128, "cache": False}, device="cpu")
    assert backend_for(c).name == "int8"
    clf = Classifier(c)
    assert clf.loaded.backend == "int8" and clf.notes[0].startswith("int8:") and "128 tokens" in clf.notes[0]
    with pytest.raises(ConfigError, match="backend auto: unknown option"):
        backend_for(c).load(cfg(tiny_dirs["qwen3"], "auto", {"bits": 4}, device="cpu"))


def test_a_head_is_fitted_on_float32_states_where_auto_runs_int8():
    from qcls.fitting.head_options import states_cfg
    c, notes = states_cfg(compose(["backend.device=cpu"]))
    assert c.backend.name == "fp16" and c.backend.options == {} and "float32 states" in notes[0]
    for chosen in (["backend=int8"], ["backend=fp16"]):  # a backend the user names is the one fitted on
        c, notes = states_cfg(compose(chosen))
        assert c.backend.name == chosen[0].split("=")[1] and notes == []
