"""The built wheel, installed into a fresh virtual environment and run from a folder outside the checkout (in
processes of its own), answers as this checkout does (in this process): the defaults, a config folder of the user's
own, `qcls check` on it, and `qcls calibrate` on the shipped dev split (everything it reads ships inside the
package)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.config.test_config_dirs import PROMPTS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
QUERIES = ["mens slim fit jeans", "夏季女士碎花连衣裙"]


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory, demo_cfg_overrides):
    """(python of a fresh venv holding only the wheel, + this environment's dependencies; its environment)."""
    tmp = tmp_path_factory.mktemp("wheel")
    # built from a copy: the build's own build/ and *.egg-info folders never appear in the checkout that other test
    # processes import from
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info",
                                                             "__pycache__", ".pytest_cache", ".dev", ".whl", ".cache",
                                                             "outputs", "multirun"))
    # no build isolation: setuptools is already here, and the test needs no network
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp / "dist"), str(src)], check=True, timeout=600, capture_output=True)
    wheels = list((tmp / "dist").glob("qcls-*.whl"))
    assert len(wheels) == 1
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "venv")], check=True, timeout=300)
    py = tmp / "venv" / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # torch & co. come from this environment's site-packages, behind the venv's own (a plain path entry: the
    # editable install's .pth hook there is not run, so only the wheel's qcls is importable)
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheels[0])], check=True,
                   timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "QCLS_CONFIG_DIR")}
    env["PYTHONUNBUFFERED"] = "1"
    where = subprocess.run([str(py), "-c", "import qcls; print(qcls.__file__)"], capture_output=True, text=True,
                           cwd=tmp, env=env, check=True).stdout.strip()
    assert where.startswith(str(site)), where  # the wheel's copy, not the checkout
    for name in ("index.html", "playground.css", "playground.js"):  # the playground page (package data)
        assert (site / "qcls" / "deployments" / "static" / name).is_file(), name
    return tmp, env


def qcls(bin_dir: Path | None, args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """The wheel's `qcls` in a process of its own, or (bin_dir None) this checkout's in this process, in `cwd`."""
    if bin_dir:
        return subprocess.run([str(bin_dir / "qcls"), *args], capture_output=True, text=True, cwd=cwd, env=env,
                              timeout=900)
    import contextlib
    import io

    from qcls.cli import main
    out, err, here = io.StringIO(), io.StringIO(), os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(args)
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(args, rc, out.getvalue(), err.getvalue())


def answers(p: subprocess.CompletedProcess) -> list[dict]:
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    return [{q["prompt"]: (q["label"], round(q["prob"], 4)) for q in r["prompts"]} for r in rows]


def test_wheel_runs_the_readme_commands_as_the_checkout_does(wheel_env, demo_cfg_overrides):
    tmp, env = wheel_env
    bin_dir = tmp / "venv" / "bin"
    work = tmp / "work"  # the user's folder, outside the checkout
    (work / "myconf" / "prompts").mkdir(parents=True)
    (work / "myconf" / "prompts" / "mine.yaml").write_text(PROMPTS, encoding="utf-8")
    # small buckets keep the warm-up short; 32 tokens hold the Chinese query in SmolLM2's byte-level pieces
    fast = [*demo_cfg_overrides, "engine.query_buckets=[8,32]", "max_query_tokens=32"]

    p = qcls(bin_dir, ["--version"], work, env)
    assert p.returncode == 0 and p.stdout.startswith("qcls 0."), p.stderr

    # the defaults: the shipped config, demo model and head
    base = ["classify", "--json", *fast, *QUERIES]
    assert answers(qcls(bin_dir, base, work, env)) == answers(qcls(None, base, work, env))

    # a config folder of the user's own, from a folder outside the repository
    own = ["--config-dir", "myconf", "classify", "--json", "prompts=mine", *fast, *QUERIES]
    wheel_own = answers(qcls(bin_dir, own, work, env))
    assert list(wheel_own[0]) == ["category_zh", "audience"]
    assert wheel_own == answers(qcls(None, own, work, env))

    check = qcls(bin_dir, ["--config-dir", "myconf", "check", "prompts=mine", *fast], work, env)
    assert check.returncode == 0, check.stderr
    assert "prompt category_zh" in check.stdout and "tokens per forward" in check.stdout

    # fitting on the shipped dev split (package data)
    fit = ["calibrate", "--eval", "dev", "--limit", "24", "--json", "calibration=null", *fast]
    for b, name in ((bin_dir, "wheel"), (None, "dev")):
        p = qcls(b, fit + [f"--out=cal_{name}.yaml"], work, env)
        assert p.returncode == 0, p.stderr[-3000:]
    import yaml
    got = [yaml.safe_load((work / f"cal_{n}.yaml").read_text()) for n in ("wheel", "dev")]
    assert got[0]["prompts"] == got[1]["prompts"] and got[0]["meta"]["fitted_on"] == "data/eval/ecommerce_dev.jsonl"
