"""Every `model.KEY=…` override the docs show composes, without `+`, on every model config."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from qcls.config.compose import compose
from qcls.config import ModelSpec

ROOT = Path(__file__).resolve().parents[2]
MODELS = sorted(p.stem for p in (ROOT / "qcls" / "conf" / "model").glob("*.yaml"))
TOKEN = re.compile(r"(?<![\w+])model\.(\w+)=([^\s`\"'|,)]+)")


def documented() -> list[tuple[str, ...]]:
    """The model overrides of each line of README.md and docs/*.md, grouped as written together."""
    groups = set()
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for line in doc.read_text().splitlines():
            found = tuple(f"model.{k}={v}" for k, v in TOKEN.findall(line) if "…" not in v)  # not placeholders
            if found:
                groups.add(found)
    return sorted(groups)


def test_the_docs_show_model_overrides():
    keys = {o.split("=")[0] for g in documented() for o in g}
    assert {"model.source", "model.path"} <= keys


def test_every_model_yaml_declares_every_model_spec_key():
    import yaml
    for name in MODELS:
        data = yaml.safe_load((ROOT / "qcls" / "conf" / "model" / f"{name}.yaml").read_text())
        assert set(ModelSpec.model_fields) <= set(data), (name, set(ModelSpec.model_fields) - set(data))


@pytest.mark.parametrize("model", MODELS)
def test_documented_overrides_compose_on_every_model(model):
    groups = documented() + [("model.source=gguf", "model.path=Org/Model-GGUF", "model.gguf_file=m.Q8_0.gguf"),
                             ("model.source=hub", "model.path=Org/Model", "model.revision=main")]
    for group in groups:
        cfg = compose([f"model={model}", *group])
        for o in group:
            key, value = o.split("=", 1)
            assert str(getattr(cfg.model, key.split(".")[1])) == value, (model, group)
