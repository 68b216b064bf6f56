"""Every file a user may pass as `calibration=` that is not a head file exits 2 with the file named, what was
expected and how to get one; no decoder message, no traceback. Refused before the tokenizer or any weight
loads, so these run in milliseconds on the default demo config."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from qcls.cli import main
from qcls.config.compose import conf_dir


def make(tmp_path, case: str):
    """(the value given as calibration=, a phrase the message must hold)."""
    if case == "weights":
        from safetensors.numpy import save_file
        save_file({"category.bias": np.zeros(3, np.float32)}, str(tmp_path / "head.safetensors"))
        (tmp_path / "head.yaml").write_text("method: head\n", encoding="utf-8")
        return tmp_path / "head.safetensors", f"pass the YAML beside it: calibration={tmp_path / 'head.yaml'}"
    if case == "weights renamed":  # the safetensors bytes under another name
        from safetensors.numpy import save_file
        save_file({"category.bias": np.zeros(3, np.float32)}, str(tmp_path / "w.bin"))
        return tmp_path / "w.bin", "is a head's weights (safetensors), not its head file"
    if case == "binary":
        (tmp_path / "x.yaml").write_bytes(bytes([0xC0, 0xFF, 0x00, 0x13]) * 50)
        return tmp_path / "x.yaml", "is a binary file, not YAML text"
    if case == "empty":
        (tmp_path / "x.yaml").write_text("  \n", encoding="utf-8")
        return tmp_path / "x.yaml", "is empty"
    if case == "directory":
        (tmp_path / "heads").mkdir()
        return tmp_path / "heads", "is a directory, not a file"
    if case == "prompts yaml":
        shutil.copy(conf_dir() / "prompts" / "default.yaml", tmp_path / "p.yaml")
        return tmp_path / "p.yaml", "looks like a prompt set"
    if case == "hydra config":
        shutil.copy(conf_dir() / "config.yaml", tmp_path / "c.yaml")
        return tmp_path / "c.yaml", "looks like a qcls/Hydra config"
    if case == "a list":
        (tmp_path / "x.yaml").write_text("- a\n- b\n", encoding="utf-8")
        return tmp_path / "x.yaml", "it holds a list, not a mapping"
    if case == "not yaml":
        (tmp_path / "x.yaml").write_text("method: [head\n", encoding="utf-8")
        return tmp_path / "x.yaml", "is not valid YAML"
    assert case == "missing"
    return tmp_path / "nope.yaml", "no such file"


@pytest.mark.parametrize("case", ["weights", "weights renamed", "binary", "empty", "directory", "prompts yaml",
                                  "hydra config", "a list", "not yaml", "missing"])
def test_bad_calibration_file_exits_2_with_its_message(tmp_path, capfd, case):
    value, phrase = make(tmp_path, case)
    assert main(["classify", f"calibration={value}", "red dress"]) == 2
    err = capfd.readouterr().err
    assert err.startswith("qcls: error:") and str(value) in err and phrase in err
    assert "Traceback" not in err and "codec" not in err and "utf-8" not in err
    assert "`qcls calibrate`" in err  # what is expected
    assert "qcls calibrate --method head --out FILE.yaml" in err or "calibration=" in phrase  # how to get one
