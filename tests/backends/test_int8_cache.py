"""backend=int8's calibrated weights on disk: a second start with the same weights, calibration text and options
reads them and answers exactly as the calibrating start did; anything else calibrates again; a damaged file or an
unwritable folder costs a calibration, said at start-up, never a failed start."""
from __future__ import annotations

import pytest
import torch

from qcls.backends import int8_cache
from qcls.backends import int8_calibration as cal
from qcls.backends.registry import get_backend
from qcls.classifier import Classifier
from qcls.engine.int8_linear import Int8Linear
from tests.backends.helpers import PROMPTS, scores
from tests.conftest import tiny_cfg


def int8_cfg(tiny_dirs, cache_dir, prompts=PROMPTS, **options):
    return tiny_cfg(tiny_dirs["qwen3"], prompts, cache_dir=str(cache_dir),
                    backend={"name": "int8", "options": {"calibration_tokens": 128, **options}})


def buffers(loaded) -> dict[str, torch.Tensor]:
    return {f"{n}.{b}": getattr(m, b) for n, m in loaded.model.named_modules() if isinstance(m, Int8Linear)
            for b in int8_cache.BUFFERS if getattr(m, b) is not None}


def files(root):
    return sorted((root / "int8").glob("*.safetensors"))


def test_a_second_start_reads_the_weights_and_answers_alike(tiny_dirs, tmp_path, monkeypatch):
    c = int8_cfg(tiny_dirs, tmp_path)
    first = get_backend("int8").load(c)
    assert len(files(tmp_path)) == 1 and f"; saved to {files(tmp_path)[0]}" in first.info[0]

    def no_calibration(*args, **kwargs):
        raise AssertionError("calibrated again although the cache holds this calibration")

    monkeypatch.setattr(cal, "quantize_model", no_calibration)
    second = get_backend("int8").load(c)
    assert second.info[0] == first.info[0].replace("; saved to", "; read from").removesuffix(" for the next start")
    want, got = buffers(first), buffers(second)
    assert want.keys() == got.keys() and len(want) >= 7 * len(first.model.model.layers)
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert torch.equal(scores(Classifier(c, loaded=first)), scores(Classifier(c, loaded=second)))


def test_other_prompts_or_options_calibrate_again_and_old_files_go(tiny_dirs, tmp_path):
    load = get_backend("int8").load
    load(int8_cfg(tiny_dirs, tmp_path))
    oldest = files(tmp_path)[0]
    other = load(int8_cfg(tiny_dirs, tmp_path, alphas=[0.0, 0.5]))
    assert "; saved to" in other.info[0] and len(files(tmp_path)) == 2
    newest = load(int8_cfg(tiny_dirs, tmp_path, prompts=PROMPTS[:1]))
    assert "; saved to" in newest.info[0]
    kept = files(tmp_path)  # one model's newest KEEP files
    assert len(kept) == int8_cache.KEEP and oldest not in kept and any(str(k) in newest.info[0] for k in kept)
    off = load(int8_cfg(tiny_dirs, tmp_path / "off", cache=False))
    assert "saved to" not in off.info[0] and not (tmp_path / "off").exists()


def test_other_weights_have_another_key(tiny_dirs, tmp_path):
    from qcls.backends import sources
    model = sources.load_model(sources.Source(tiny_dirs["qwen3"]), torch.float32)
    key = int8_cache.weights_key(model)
    with torch.no_grad():
        model.model.layers[-1].mlp.down_proj.weight.mul_(1.01)  # a fine-tune of the linears only
    assert int8_cache.weights_key(model) != key


def test_a_damaged_file_is_said_and_replaced(tiny_dirs, tmp_path):
    c = int8_cfg(tiny_dirs, tmp_path)
    first = get_backend("int8").load(c)
    path = files(tmp_path)[0]
    path.write_bytes(path.read_bytes()[:1000])
    again = get_backend("int8").load(c)
    assert any(n.startswith(f"int8: {path} could not be read") and n.endswith("calibrated again")
               for n in again.notes), again.notes
    assert "; saved to" in again.info[0]
    assert all(torch.equal(a, b) for a, b in zip(buffers(first).values(), buffers(again).values()))
    assert "; read from" in get_backend("int8").load(c).info[0]


def test_an_unwritable_cache_folder_costs_a_calibration_not_the_start(tiny_dirs, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    loaded = get_backend("int8").load(int8_cfg(tiny_dirs, blocker))
    assert any("could not be saved" in n and "backend.options.cache=false" in n for n in loaded.notes), loaded.notes
    scores(Classifier(int8_cfg(tiny_dirs, blocker), loaded=loaded))


def test_a_cache_option_that_is_not_a_bool_is_refused(tiny_dirs, tmp_path):
    from qcls.errors import ConfigError
    with pytest.raises(ConfigError, match="cache must be true or false"):
        get_backend("int8").load(int8_cfg(tiny_dirs, tmp_path, cache="yes"))


def test_a_read_calibration_names_the_query_file_given_now(tiny_dirs, tmp_path):
    first, moved = tmp_path / "a.txt", tmp_path / "b.txt"
    for f in (first, moved):
        f.write_text("red dress\nblue jeans\n")
    get_backend("int8").load(int8_cfg(tiny_dirs, tmp_path, calibration_queries=str(first)))
    again = get_backend("int8").load(int8_cfg(tiny_dirs, tmp_path, calibration_queries=str(moved)))
    assert "; read from" in again.info[0] and f"the queries of {moved}" in again.info[0]


def test_the_cache_is_turned_off_from_the_command_line():
    from qcls.backends.int8 import options
    from qcls.config.compose import compose
    assert options(compose(["backend=int8"]))["cache"] is True
    assert options(compose(["backend=int8", "backend.options.cache=false"]))["cache"] is False


def test_a_read_only_cache_is_read(tiny_dirs, tmp_path, monkeypatch):
    c = int8_cfg(tiny_dirs, tmp_path)
    get_backend("int8").load(c)

    def read_only(*args, **kwargs):  # what a cache folder mounted read-only answers (root is never refused here)
        raise PermissionError(30, "Read-only file system")

    monkeypatch.setattr(int8_cache.os, "utime", read_only)
    again = get_backend("int8").load(c)
    assert "; read from" in again.info[0] and not again.notes


def test_a_write_that_fails_halfway_leaves_no_file(tiny_dirs, tmp_path, monkeypatch):
    import safetensors.torch

    def disk_full(tensors, filename, metadata=None):
        open(filename, "wb").write(b"half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", disk_full)
    loaded = get_backend("int8").load(int8_cfg(tiny_dirs, tmp_path))
    assert any("No space left on device" in n for n in loaded.notes), loaded.notes
    assert list((tmp_path / "int8").iterdir()) == []
