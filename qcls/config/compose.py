"""Hydra composition → validated `QclsConfig`. The one place config files become a config object.

The shipped config groups are `qcls/conf/`; a user's own folders (`config_dir=`, `--config-dir`,
QCLS_CONFIG_DIR: qcls/config/paths.py) go in front of them. A group option may also be given as a path to a YAML file
(`prompts=./my_prompts.yaml`): the file is used as that group's option without copying it anywhere. A process
keeps its recent compositions, each reused while every YAML file of the folders searched is as it was.
"""
from __future__ import annotations

import contextlib
import copy
import os
import re
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from pydantic import ValidationError

from qcls.config.errors import GLOBAL_GROUPS
from qcls.config.paths import CONF_DIR, user_config_dirs
from qcls.config.schema import QclsConfig
from qcls.errors import ConfigError

__all__ = ["ConfigError", "compose", "conf_dir", "validate"]

FILE_GROUPS = ("prompts", "model", "backend", "scoring", "engine", "serve", "gpu", "eval")


def conf_dir() -> Path:
    """The shipped Hydra config folder (`qcls/conf/`, inside the package)."""
    return CONF_DIR


def validate(cfg: DictConfig | dict, sources: dict[str, Path] | None = None) -> QclsConfig:
    """Validate a composed Hydra config (or a plain dict) into a frozen `QclsConfig`. `sources` ({group:
    file}) lets an error in a group's file name that file and the line of the offending field."""
    data = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    data = {k: v for k, v in data.items() if k != "hydra"}
    try:
        cfg = QclsConfig.model_validate(data)
    except ValidationError as e:
        from qcls.config.errors import describe
        raise ConfigError("invalid qcls config:\n" + "\n".join(describe(e, sources or {}))) from None
    if cfg.serve.autoscaling:
        from qcls.config.autoscaling import autoscaling_config, ray_serve_installed
        if ray_serve_installed():  # else checked where the app is built (which needs Ray): a serving setting
            autoscaling_config(cfg.serve.autoscaling)  # never blocks `qcls classify` on a machine without Ray
    return cfg


def compose(overrides: list[str] | tuple[str, ...] = (), config_dir: str | Path | list | None = None
            ) -> QclsConfig:
    """Compose the config with Hydra overrides (`model=qwen3_4b scoring=exact …`) and validate. `config_dir`:
    a folder (or list of folders) of the user's own config groups, in front of the shipped ones."""
    cfg, sources = compose_with_sources(overrides, config_dir=config_dir)
    return validate(cfg, sources)


def compose_raw(overrides: list[str] | tuple[str, ...] = (), config_name: str = "config",
                config_dir: str | Path | list | None = None) -> DictConfig:
    """Hydra's composition with overrides, not yet validated; a bad override is a ConfigError."""
    return compose_with_sources(overrides, config_name, config_dir)[0]


def compose_with_sources(overrides: list[str] | tuple[str, ...] = (), config_name: str = "config",
                         config_dir: str | Path | list | None = None) -> tuple[DictConfig, dict[str, Path]]:
    """(composed config, {group: the file its chosen option came from})."""
    extra = _dirs(config_dir)
    overrides, file_dirs = _file_options(list(overrides))
    key = None if file_dirs else _composition_key(overrides, config_name, extra)
    if key is not None and (hit := _composed.get(key)) is not None:
        return copy.deepcopy(hit[0]), dict(hit[1])
    # a temporary folder only to offer group=FILE.yaml files to Hydra
    with (tempfile.TemporaryDirectory(prefix="qcls-conf-") if file_dirs else contextlib.nullcontext()) as tmp:
        dirs = extra + (_link_files(file_dirs, Path(tmp)) if file_dirs else [])
        cfg = _hydra_compose(overrides, config_name, dirs)
        sources = _sources(cfg, dirs, file_dirs)
    if "hydra" in cfg:
        from omegaconf import open_dict
        with open_dict(cfg):
            del cfg["hydra"]
    if key is not None:
        _composed.put(key, (copy.deepcopy(cfg), dict(sources)))
    return cfg, sources


class _Compositions:
    """The last COMPOSED_KEPT compositions of this process, by their key (`_composition_key`): Hydra takes about
    0.2 s a composition on a 2-core machine, a copy of a kept one about a hundredth of that."""

    def __init__(self, kept: int):
        self.kept, self.items, self.lock = kept, OrderedDict(), threading.Lock()

    def get(self, key):
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
            return self.items.get(key)

    def put(self, key, value) -> None:
        with self.lock:
            self.items[key] = value
            while len(self.items) > self.kept:
                self.items.popitem(last=False)


COMPOSED_KEPT = 64
_composed = _Compositions(COMPOSED_KEPT)


def _composition_key(overrides: list[str], config_name: str, extra: list[Path]) -> tuple:
    """What a composition reads: the overrides, and every YAML file of the folders searched (path, size and
    modification time: a file edited, added or removed makes a new key). Hydra's own configs ship with it."""
    files = []
    for d in [*extra, *user_config_dirs(), CONF_DIR]:
        for top, subdirs, names in os.walk(d):
            subdirs[:] = sorted(s for s in subdirs if not s.startswith((".", "__")))  # an option may be prompts/a/b
            for name in sorted(names):
                if name.endswith((".yaml", ".yml")):
                    with contextlib.suppress(OSError):
                        st = os.stat(os.path.join(top, name))
                        files.append((top, name, st.st_size, st.st_mtime_ns))
    return tuple(overrides), config_name, tuple(str(d) for d in extra), tuple(files)


def export_user_config(config_dirs: list[str], overrides: list[str]) -> list[str]:
    """For a whole process (the CLI): put the user's folders, and a folder offering any `group=FILE.yaml`
    override's file, into QCLS_CONFIG_DIR, so every composition in this process and in the processes it starts
    (sweep jobs, a Hydra app) finds them. Returns the overrides with such files replaced by their option name."""
    import atexit
    import os
    import shutil

    from qcls.config.paths import ENV_CONFIG_DIR
    dirs = [str(d) for d in _dirs(config_dirs)]
    overrides, files = _file_options(list(overrides))
    if files:
        tmp = Path(tempfile.mkdtemp(prefix="qcls-conf-"))
        atexit.register(shutil.rmtree, tmp, ignore_errors=True)
        dirs = [str(d) for d in _link_files(files, tmp)] + dirs
    if dirs:
        old = [p for p in os.environ.get(ENV_CONFIG_DIR, "").split(os.pathsep) if p]
        os.environ[ENV_CONFIG_DIR] = os.pathsep.join(dirs + old)
    return overrides


def _dirs(config_dir) -> list[Path]:
    given = [] if config_dir is None else ([config_dir] if isinstance(config_dir, (str, Path)) else list(config_dir))
    for d in given:
        if not Path(d).expanduser().is_dir():
            raise ConfigError(f"config folder {d} does not exist", "give a folder that holds config groups "
                              "such as prompts/NAME.yaml (qcls --config-dir DIR, QCLS_CONFIG_DIR, config_dir=)")
    for d in user_config_dirs():
        if not d.is_dir():
            raise ConfigError(f"QCLS_CONFIG_DIR names {d}, which is not a folder", "fix or unset QCLS_CONFIG_DIR")
    return [Path(d).expanduser().resolve() for d in given]


def _file_options(overrides: list[str]) -> tuple[list[str], dict[str, Path]]:
    """`group=path/to/file.yaml` → `group=<stem>` plus the file to offer as that option."""
    out, files = [], {}
    for ov in overrides:
        m = re.match(r"^(\w+)=(.+\.ya?ml)$", ov)
        if m and m.group(1) in FILE_GROUPS:
            f = Path(m.group(2)).expanduser()
            if not f.is_file():
                raise ConfigError(f"{ov}: no such file {f.resolve()}", f"give an existing YAML file, or an option "
                                  f"name of the {m.group(1)} group (qcls --help lists them)")
            files[m.group(1)] = f.resolve()
            ov = f"{m.group(1)}={f.stem}"
        out.append(ov)
    return out, files


def _link_files(files: dict[str, Path], tmp: Path) -> list[Path]:
    """A config folder holding just those files (links, so Hydra reads the user's own file)."""
    if not files:
        return []
    for group, f in files.items():
        (tmp / group).mkdir(parents=True, exist_ok=True)
        target = tmp / group / f"{f.stem}.yaml"
        text = f.read_text(encoding="utf-8", errors="replace")
        if group in GLOBAL_GROUPS:
            _check_global_file(group, f, text)
        if group in GLOBAL_GROUPS and "@package" not in text.split("\n", 1)[0]:
            # a prompts file written as `prompts: [...]` needs the header that puts it at the top level; the
            # header is a comment, so line numbers in error messages stay the user's own, and the copy
            # remembers whose it is (SOURCE_SUFFIX) so that errors name the user's file
            target.write_text("# @package _global_\n" + text, encoding="utf-8")
            target.with_name(target.name + SOURCE_SUFFIX).write_text(str(f), encoding="utf-8")
        else:
            target.symlink_to(f)
    return [tmp]


SOURCE_SUFFIX = ".source"


def _check_global_file(group: str, f: Path, text: str) -> None:
    """A file given as `prompts=FILE.yaml` must hold a `prompts:` list: anything else (a head file, a Hydra
    config) is refused naming the file, before Hydra reads it."""
    import yaml
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{group}={f}: not valid YAML ({str(e).splitlines()[0]})",
                          f"a {group} file holds `{group}:` with a list, as qcls/conf/{group}/*.yaml do") from None
    if not isinstance(data, dict) or not isinstance(data.get(group), list):
        keys = sorted(data)[:6] if isinstance(data, dict) else type(data).__name__
        raise ConfigError(f"{group}={f} is not a {group} file: it has no top-level `{group}:` list (it holds {keys})",
                          f"a {group} file holds `{group}:` with a list of prompts (name, template, label_prefix, "
                          f"labels), as qcls/conf/{group}/*.yaml do")


def _hydra_compose(overrides: list[str], config_name: str, dirs: list[Path]) -> DictConfig:
    # initialize_config_dir takes one folder; the user's go in front of it the same way the search-path plugin
    # (hydra_plugins/qcls_config_dir) puts QCLS_CONFIG_DIR's there, through the same Hydra calls it makes
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from hydra.types import RunMode

    search_path = create_config_search_path(str(CONF_DIR))
    for d in reversed(dirs):
        search_path.prepend(provider="qcls-user", path=f"file://{d}")
    gh = GlobalHydra.instance()
    saved = gh.hydra if gh.is_initialized() else None
    gh.clear()
    try:
        Hydra.create_main_hydra2(task_name="qcls", config_search_path=search_path)
        return gh.hydra.compose_config(config_name=config_name, overrides=list(overrides), run_mode=RunMode.RUN,
                                       from_shell=False, with_log_configuration=False)
    except HydraException as e:
        # Hydra's advice to append a missing key with `+` would only meet pydantic's unknown-key refusal, and its
        # config search path is about Hydra's internals, not the user's input
        msg = str(e).split("\nConfig search path:")[0].rstrip()
        msg = "\n".join(line for line in msg.splitlines() if not line.startswith("To append to your config"))
        raise ConfigError(f"bad override: {msg}", _override_hint(msg, dirs)) from None
    finally:
        gh.clear()
        if saved is not None:
            gh.initialize(saved)


def _sources(cfg: DictConfig, dirs: list[Path], files: dict[str, Path]) -> dict[str, Path]:
    """{group: file of its chosen option} from Hydra's record of the choices."""
    choices = OmegaConf.select(cfg, "hydra.runtime.choices") or {}
    search = [*dirs, *user_config_dirs(), CONF_DIR]
    out: dict[str, Path] = {}
    for key, option in choices.items():
        group = str(key).split("@")[0]
        if option is None or group.startswith("hydra") or group not in FILE_GROUPS:
            continue
        if group in files:
            out[group] = files[group]
            continue
        for d in search:
            f = d / group / f"{option}.yaml"
            if f.is_file():
                # a file given as group=FILE.yaml is linked (or copied, SOURCE_SUFFIX) from a temporary folder
                src = f.with_name(f.name + SOURCE_SUFFIX)
                out[group] = Path(src.read_text(encoding="utf-8")) if src.is_file() else f.resolve()
                break
    return out


def _override_hint(msg: str, dirs: list[Path]) -> str | None:
    """Hydra's own advice on a key missing from the YAML is to append it with `+`; every model YAML
    declares every ModelSpec key, so a missing key is a typo, not a key to append."""
    if re.search(r"Could not override '[\w.]+'\.", msg):  # a plain key (a defaults-list entry has '@')
        return ("the key is not in qcls's config: check its spelling against qcls/config/schema.py (`qcls --help` "
                "lists the groups); a group is chosen with group=option, e.g. model=qwen3_8b")
    m = re.search(r"Could not find '(\w+)/([^']+)'", msg)
    if m:
        return (f"your own {m.group(1)} go in a folder given with --config-dir DIR (DIR/{m.group(1)}/NAME.yaml, then "
                f"{m.group(1)}=NAME), or pass the file itself: {m.group(1)}=./NAME.yaml")
    return None
