"""Where qcls finds what it reads at run time: the shipped package data and the user's own config folders.

Everything qcls ships (the Hydra config groups in `qcls/conf/`, the demo heads in `qcls/data/heads/`, the
labelled splits in `qcls/data/eval/`) lives inside the package, so a wheel or `pip install .` runs exactly as a
checkout does. A relative path in a config (`calibration=data/heads/x.yaml`, `eval.path=data/eval/x.jsonl`) is
looked up in the current directory first, then in the package: the user's files win, the shipped ones are the
fallback.

A user's own config groups (`prompts/`, `model/`, `eval/`, …) live in folders of their own: `--config-dir DIR`
on the command line, `QCLS_CONFIG_DIR` (several joined by the OS path separator), or `config_dir=` in Python.
They sit in front of the shipped `qcls/conf/` in Hydra's search path, so a group option of the same name
overrides the shipped one and a new name sits beside them.
"""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # qcls/, this file being qcls/config/paths.py
CONF_DIR = PACKAGE_DIR / "conf"
ENV_CONFIG_DIR = "QCLS_CONFIG_DIR"


def user_config_dirs(extra: list[str | Path] | tuple = ()) -> list[Path]:
    """The user's config folders, first wins: `extra` (from a call), then QCLS_CONFIG_DIR's entries."""
    env = [p for p in os.environ.get(ENV_CONFIG_DIR, "").split(os.pathsep) if p]
    out: list[Path] = []
    for p in [*extra, *env]:
        path = Path(p).expanduser().resolve()
        if path not in out:
            out.append(path)
    return out


def config_dirs(extra: list[str | Path] | tuple = ()) -> list[Path]:
    """Every config folder in search order: the user's, then the shipped `qcls/conf/`."""
    return [*user_config_dirs(extra), CONF_DIR]


def group_options(group: str, extra: list[str | Path] | tuple = ()) -> dict[str, Path]:
    """`{option: file}` of a config group across the user's folders and the shipped one (first wins)."""
    found: dict[str, Path] = {}
    for d in config_dirs(extra):
        for f in sorted((d / group).glob("*.yaml")):
            found.setdefault(f.stem, f)
    return found


def candidates(value: str | Path) -> list[Path]:
    """Where a path given in a config is looked for: itself if absolute, else the current directory, then
    the package (shipped data)."""
    p = Path(value).expanduser()
    return [p] if p.is_absolute() else [Path.cwd() / p, PACKAGE_DIR / p]


def find_file(value: str | Path) -> Path | None:
    """The first existing file among `candidates(value)`, resolved; None if there is none."""
    for cand in candidates(value):
        if cand.is_file():
            return cand.resolve()
    return None


def shown(path: str | Path) -> str:
    """A shipped file by its path inside the package (`data/eval/ecommerce_dev.jsonl`), anything else as is:
    what a head file records, so it means the same on every machine."""
    try:
        return str(Path(path).resolve().relative_to(PACKAGE_DIR))
    except ValueError:
        return str(path)
