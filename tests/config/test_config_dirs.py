"""The user's own config folders and files (qcls/config/paths.py, qcls/config/compose.py, the Hydra plugin): they
sit in front of the shipped groups, work from any directory, and a typo in them names the file, the line and the
field."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from qcls.cli.commands import take_config_dirs, version_text
from qcls.config.compose import compose, compose_raw
from qcls.errors import ConfigError
from qcls.config.paths import CONF_DIR, PACKAGE_DIR, group_options, shown

PROMPTS = """# @package _global_
prompts:
  - name: category_zh
    template: "商品: {query}\\n类目:"
    label_prefix: " "
    labels: ["连衣裙", "牛仔裤", "其他"]
  - name: audience
    template: "query: {query}\\naudience:"
    labels: ["man", "woman", "none"]
"""


@pytest.fixture
def myconf(tmp_path) -> Path:
    (tmp_path / "myconf" / "prompts").mkdir(parents=True)
    (tmp_path / "myconf" / "prompts" / "mine.yaml").write_text(PROMPTS, encoding="utf-8")
    return tmp_path / "myconf"


def names(cfg) -> list[str]:
    return [p.name for p in cfg.prompts]


def test_shipped_config_is_package_data():
    assert CONF_DIR == PACKAGE_DIR / "conf" and (CONF_DIR / "config.yaml").is_file()
    assert (PACKAGE_DIR / "data" / "heads" / "smollm2_demo.yaml").is_file()
    assert (PACKAGE_DIR / "data" / "eval" / "ecommerce_dev.jsonl").is_file()
    assert shown(PACKAGE_DIR / "data" / "eval" / "ecommerce_dev.jsonl") == "data/eval/ecommerce_dev.jsonl"
    assert shown("/elsewhere/x.jsonl") == "/elsewhere/x.jsonl"


def test_a_config_dir_adds_options_from_any_directory(myconf, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert names(compose(["prompts=mine"], config_dir=myconf)) == ["category_zh", "audience"]
    assert "mine" in group_options("prompts", [myconf]) and "default" in group_options("prompts", [myconf])
    # the shipped options are still there beside it
    assert names(compose(["prompts=ecommerce8"], config_dir=myconf))[0] == "category"
    with pytest.raises(ConfigError, match="Could not find 'prompts/mine'") as e:
        compose(["prompts=mine"])  # without the folder
    assert "--config-dir" in e.value.way_out


def test_a_kept_composition_is_a_copy_and_follows_the_files(myconf, monkeypatch):
    """compose() keeps recent compositions; an edited, added or removed file in a searched folder (the user's, or
    QCLS_CONFIG_DIR's) is read again, and a kept one is never handed out to be changed."""
    mine = myconf / "prompts" / "mine.yaml"
    assert compose(["prompts=mine"], config_dir=myconf).prompts[1].labels == ["man", "woman", "none"]
    raw = compose_raw(["prompts=mine"], config_dir=myconf)
    raw.prompts[1].labels[0] = "changed by a caller"
    assert compose_raw(["prompts=mine"], config_dir=myconf).prompts[1].labels[0] == "man"
    mine.write_text(PROMPTS.replace('"woman"', '"lady"'), encoding="utf-8")
    st = mine.stat()
    os.utime(mine, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # an edit within the clock's tick changes it too
    assert compose(["prompts=mine"], config_dir=myconf).prompts[1].labels == ["man", "lady", "none"]
    (myconf / "prompts" / "other.yaml").write_text(PROMPTS, encoding="utf-8")
    assert names(compose(["prompts=other"], config_dir=myconf)) == ["category_zh", "audience"]
    deep = myconf / "prompts" / "shop" / "zh" / "deep.yaml"  # an option in nested folders: prompts=shop/zh/deep
    deep.parent.mkdir(parents=True)
    deep.write_text(PROMPTS, encoding="utf-8")
    assert names(compose(["prompts=shop/zh/deep"], config_dir=myconf)) == ["category_zh", "audience"]
    deep.write_text(PROMPTS.replace("category_zh", "kind"), encoding="utf-8")
    os.utime(deep, ns=(deep.stat().st_atime_ns, deep.stat().st_mtime_ns + 10**9))
    assert names(compose(["prompts=shop/zh/deep"], config_dir=myconf)) == ["kind", "audience"]
    mine.unlink()
    with pytest.raises(ConfigError, match="Could not find 'prompts/mine'"):
        compose(["prompts=mine"], config_dir=myconf)
    monkeypatch.setenv("QCLS_CONFIG_DIR", str(myconf))  # the same folder through the environment
    assert names(compose(["prompts=other"])) == ["category_zh", "audience"]
    (myconf / "prompts" / "other.yaml").write_text(PROMPTS.replace("category_zh", "kind"), encoding="utf-8")
    st = (myconf / "prompts" / "other.yaml").stat()
    os.utime(myconf / "prompts" / "other.yaml", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert names(compose(["prompts=other"])) == ["kind", "audience"]


def test_a_config_dir_overrides_a_shipped_option_of_the_same_name(myconf):
    (myconf / "prompts" / "default.yaml").write_text(PROMPTS, encoding="utf-8")
    assert names(compose(["prompts=default"], config_dir=myconf)) == ["category_zh", "audience"]
    assert names(compose(["prompts=default"])) == ["category", "audience"]


def test_the_environment_variable_reaches_every_composition(myconf, monkeypatch):
    """QCLS_CONFIG_DIR (what `qcls --config-dir` sets) works through the Hydra plugin, so Hydra apps see it too."""
    monkeypatch.setenv("QCLS_CONFIG_DIR", str(myconf))
    assert names(compose(["prompts=mine"])) == ["category_zh", "audience"]
    raw = compose_raw(["prompts=mine", "eval=test"], config_name="sweep")  # the sweep's own config
    assert raw.eval.path.endswith("ecommerce_test.jsonl") and raw.prompts[0].name == "category_zh"
    monkeypatch.setenv("QCLS_CONFIG_DIR", str(myconf / "missing"))
    with pytest.raises(ConfigError, match="QCLS_CONFIG_DIR names .*missing, which is not a folder"):
        compose([])


def test_a_prompt_file_by_path_with_or_without_the_package_header(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text(PROMPTS, encoding="utf-8")
    assert names(compose([f"prompts={f}"])) == ["category_zh", "audience"]
    bare = tmp_path / "bare.yml"
    bare.write_text(PROMPTS.split("\n", 1)[1], encoding="utf-8")  # without `# @package _global_`
    assert names(compose([f"prompts={bare}"])) == ["category_zh", "audience"]
    with pytest.raises(ConfigError, match=r"prompts=.*nope\.yaml: no such file"):
        compose([f"prompts={tmp_path / 'nope.yaml'}"])


def test_a_typo_names_the_file_the_line_and_the_field(myconf):
    bad = PROMPTS.replace('    labels: ["man"', '    lables: ["man"')
    (myconf / "prompts" / "typo.yaml").write_text(bad, encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        compose(["prompts=typo"], config_dir=myconf)
    text = str(e.value)
    where = f"{myconf / 'prompts' / 'typo.yaml'}, line 9: prompts.1.lables: Extra inputs are not permitted"
    assert where in text and "unknown key" in text
    assert "prompts.1.labels: Field required" in text
    (myconf / "prompts" / "nohead.yaml").write_text(PROMPTS.split("\n", 1)[1], encoding="utf-8")
    with pytest.raises(ConfigError, match=r"nohead.yaml, line 2: prompts: Input should be a valid list.*"
                                          r"# @package _global_"):
        compose(["prompts=nohead"], config_dir=myconf)


def test_a_missing_config_dir_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"config folder .*nowhere does not exist"):
        compose([], config_dir=tmp_path / "nowhere")


def test_cli_takes_config_dirs_anywhere_on_the_line():
    assert take_config_dirs(["--config-dir", "a", "classify", "--config-dir=b", "x", "-cd", "c"]) == (
        ["a", "b", "c"], ["classify", "x"])
    with pytest.raises(ValueError, match="needs a folder"):
        take_config_dirs(["classify", "--config-dir"])


def test_version():
    from qcls import __version__
    assert version_text().startswith(f"qcls {__version__}")
    p = subprocess.run([sys.executable, "-m", "qcls.cli", "--version"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.startswith("qcls ")


def test_cli_check_with_a_config_dir(myconf, tiny_dirs, tmp_path, monkeypatch, capsys):
    """`qcls --config-dir DIR check prompts=NAME` from another directory, on a local tiny model (in this process:
    main() puts the environment back as it found it)."""
    from qcls.cli import main
    model = ["model=qwen3_4b", "model.source=local", f"model.path={tiny_dirs['qwen3_qwentok']}", "calibration=null"]
    monkeypatch.delenv("QCLS_CONFIG_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(["--config-dir", str(myconf), "check", "prompts=mine", *model]) == 0
    out = capsys.readouterr()
    assert "prompt category_zh" in out.out and "prompt audience" in out.out, out.err
    assert "QCLS_CONFIG_DIR" not in os.environ
    assert main(["check", "prompts=mine", *model]) == 2
    err = capsys.readouterr().err
    assert "Could not find 'prompts/mine'" in err and "--config-dir" in err


def test_serve_config_builder_takes_a_config_dir(myconf):
    from qcls.deployments.app import build_app
    app = build_app({"overrides": ["prompts=mine", "calibration=null"], "config_dir": str(myconf)})
    cfg = app._bound_deployment.init_args[0]
    assert names(cfg) == ["category_zh", "audience"]


def test_a_head_found_in_the_working_directory_travels_as_an_absolute_path(tmp_path, monkeypatch):
    from qcls.heads.startup import portable
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text("method: head\n")
    cfg = compose(["calibration=mine.yaml"])
    assert portable(cfg).calibration == str((tmp_path / "mine.yaml").resolve())
    shipped = compose([])  # the model's own head: found in the package by every process itself
    assert portable(shipped) == shipped and shipped.calibration == "model"
    assert shipped.model.head == "data/heads/gemma3_demo.yaml"


def test_a_file_that_is_not_a_prompts_file_is_refused_by_name(tmp_path):
    head = tmp_path / "head.yaml"
    head.write_text("method: head\nweights: head.safetensors\nprompts: {category: {labels: [a, b]}}\n")
    with pytest.raises(ConfigError, match=r"prompts=.*head\.yaml is not a prompts file: it has no top-level "
                                          r"`prompts:` list \(it holds \['method', 'prompts', 'weights'\]\)"):
        compose([f"prompts={head}"])


def test_the_cli_names_the_users_file_for_a_typo_in_a_file_without_the_header(tmp_path, monkeypatch, capsys):
    """group=FILE.yaml through the CLI (QCLS_CONFIG_DIR and a temporary copy with the header): the error still
    names the user's own file and its line."""
    import os

    from qcls.cli import main
    monkeypatch.delenv("QCLS_CONFIG_DIR", raising=False)
    bad = tmp_path / "bad.yaml"
    bad.write_text(PROMPTS.split("\n", 1)[1].replace('    labels: ["man"', '    lables: ["man"'), encoding="utf-8")
    assert main(["check", f"prompts={bad}"]) == 2
    err = capsys.readouterr().err
    assert f"{bad}, line 8: prompts.1.lables: Extra inputs are not permitted" in err and "qcls-conf-" not in err
    assert "QCLS_CONFIG_DIR" not in os.environ  # main() puts the environment back as it found it
