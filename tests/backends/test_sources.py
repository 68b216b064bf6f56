"""Model sources: local directories, hub ids (offline mode honoured), GGUF paths, the demo package."""
from __future__ import annotations

import os

import pytest

from qcls.backends import sources
from qcls.config import ModelSpec


def test_local_dir_must_be_a_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        sources.resolve(ModelSpec(name="m", source="local", path=str(tmp_path)), None)


def test_local_dir_resolves_and_loads(tiny_dirs):
    src = sources.resolve(ModelSpec(name="m", source="local", path=tiny_dirs["qwen2"]), None)
    assert src.path == tiny_dirs["qwen2"] and sources.load_config(src).model_type == "qwen2"


def test_a_local_tokenizer_is_read_once_then_from_the_cache_folder(tiny_dirs, tmp_path, monkeypatch):
    import shutil
    monkeypatch.setenv("QCLS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(sources, "SMALL_TOKENIZER", 0)  # the tiny tokenizer stands for a large one
    folder = shutil.copytree(tiny_dirs["qwen3"], tmp_path / "model")
    src = sources.Source(str(folder))
    first = sources.load_tokenizer(src)
    [stored] = (tmp_path / "cache" / "tokenizers").iterdir()
    again = sources.load_tokenizer(src)
    assert again is not first and type(again) is type(first)
    for text in ["mens slim fit jeans", "男士牛仔裤 <|im_end|>", " spaces\u00a0and 🙂"]:
        assert again.encode(text, add_special_tokens=False) == first.encode(text, add_special_tokens=False)
    assert again.eos_token == first.eos_token and len(again) == len(first)
    stored.write_bytes(b"torn")  # a file that does not load: the folder is read again and the file replaced
    assert sources.load_tokenizer(src).encode("red dress") == first.encode("red dress")
    assert stored.read_bytes() != b"torn"
    tok = folder / "tokenizer_config.json"
    os.utime(tok, ns=(tok.stat().st_atime_ns, tok.stat().st_mtime_ns + 10**9))  # an edited folder: a new entry
    sources.load_tokenizer(src)
    assert len(list((tmp_path / "cache" / "tokenizers").iterdir())) == 2


def test_a_small_tokenizer_is_not_stored_and_the_most_recently_read_are_kept(tiny_dirs, tmp_path, monkeypatch):
    import shutil
    monkeypatch.setenv("QCLS_CACHE_DIR", str(tmp_path / "cache"))
    stored = tmp_path / "cache" / "tokenizers"
    folders = [sources.Source(str(shutil.copytree(tiny_dirs["qwen3"], tmp_path / f"model{i}"))) for i in range(4)]
    sources.load_tokenizer(folders[0])  # its files are far under SMALL_TOKENIZER: read from the folder each time
    assert not stored.exists() or not list(stored.iterdir())
    monkeypatch.setattr(sources, "SMALL_TOKENIZER", 0)
    monkeypatch.setattr(sources, "TOKENIZERS_KEPT", 2)
    for src in folders[:2]:
        sources.load_tokenizer(src)
    first = sources._stored_tokenizer(folders[0])
    os.utime(first, (first.stat().st_atime, first.stat().st_mtime - 60))
    sources.load_tokenizer(folders[0])  # read again: the most recent
    sources.load_tokenizer(folders[2])  # a third: the least recently read goes
    assert sorted(stored.iterdir()) == sorted(sources._stored_tokenizer(f) for f in (folders[0], folders[2]))


def test_hub_id_in_offline_mode_fails_without_network(monkeypatch, tmp_path):
    from qcls.errors import HubUnreachableError
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty cache: nothing to fall back on
    with pytest.raises(HubUnreachableError, match="HF_HUB_OFFLINE is set") as err:  # before transformers is called
        sources.resolve(ModelSpec(name="m", source="hub", path="Qwen/Qwen3-4B"), None)
    assert isinstance(err.value, OSError) and "model.source=local model.path=DIR" in str(err.value)


def test_gguf_needs_a_file_or_a_file_name(tmp_path):
    with pytest.raises(FileNotFoundError, match="model.gguf_file"):
        sources.resolve(ModelSpec(name="m", source="gguf", path=str(tmp_path)), None)
    with pytest.raises(FileNotFoundError, match="model.gguf_file=x.gguf is not in the directory"):
        sources.resolve(ModelSpec(name="m", source="gguf", path=str(tmp_path), gguf_file="x.gguf"), None)
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    src = sources.resolve(ModelSpec(name="m", source="gguf", path=str(tmp_path), gguf_file="x.gguf"), None)
    assert src.gguf_file == "x.gguf"


def test_a_classifier_reads_its_tokenizer_once(tiny_dirs, monkeypatch):
    """The Classifier reads the tokenizer first (the label sets are checked before any weight is read) and hands
    it to the backend's load, which would otherwise read it again."""
    from qcls.classifier import Classifier
    from tests.conftest import prompt, tiny_cfg
    read, calls = sources.load_tokenizer, []
    monkeypatch.setattr(sources, "load_tokenizer", lambda src: calls.append(src) or read(src))
    clf = Classifier(tiny_cfg(tiny_dirs["qwen3"], [prompt("a", ["x", "y"])]))
    assert len(calls) == 1 and clf.loaded.tokenizer is clf.tokenizer
    assert clf.classify(["red dress"])[0].ok
