"""Hydra composition → validated `QclsConfig`. The one place config files become a config object."""
from __future__ import annotations

import os
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from pydantic import ValidationError

from qcls.config import QclsConfig
from qcls.errors import ConfigError

__all__ = ["ConfigError", "compose", "conf_dir", "validate"]


def conf_dir() -> Path:
    """The repository's `conf/` (QCLS_CONF_DIR overrides it, e.g. for a deployed copy)."""
    env = os.environ.get("QCLS_CONF_DIR")
    path = Path(env) if env else Path(__file__).resolve().parents[1] / "conf"
    if not (path / "config.yaml").is_file():
        raise ConfigError(f"no Hydra config at {path}/config.yaml", "install qcls from a checkout "
                          "(pip install -e .) or set QCLS_CONF_DIR to a conf/ folder")
    return path


def validate(cfg: DictConfig | dict) -> QclsConfig:
    """Validate a composed Hydra config (or a plain dict) into a frozen `QclsConfig`."""
    data = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    data = {k: v for k, v in data.items() if k != "hydra"}
    try:
        return QclsConfig.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            where = ".".join(str(p) for p in err["loc"]) or "config"
            lines.append(f"  {where}: {err['msg']}")
        raise ConfigError("invalid qcls config:\n" + "\n".join(lines)) from None


def compose(overrides: list[str] | tuple[str, ...] = ()) -> QclsConfig:
    """Compose `conf/config.yaml` with Hydra overrides (`model=qwen3_4b scoring=exact …`) and validate."""
    return validate(compose_raw(overrides))


def compose_raw(overrides: list[str] | tuple[str, ...] = (), config_name: str = "config") -> DictConfig:
    """Hydra's composition of `conf/<config_name>.yaml` with overrides, not yet validated; a bad override is a
    ConfigError."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException

    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            return hydra_compose(config_name=config_name, overrides=list(overrides))
    except HydraException as e:
        # Hydra's advice to append a missing key with `+` would only meet pydantic's unknown-key refusal, and its
        # config search path is about Hydra's internals, not the user's input
        msg = str(e).split("\nConfig search path:")[0].rstrip()
        msg = "\n".join(line for line in msg.splitlines() if not line.startswith("To append to your config"))
        raise ConfigError(f"bad override: {msg}", _override_hint(msg)) from None


def _override_hint(msg: str) -> str | None:
    """Hydra's own advice on a key missing from the YAML is to append it with `+`; every model YAML
    declares every ModelSpec key, so a missing key is a typo, not a key to append."""
    if re.search(r"Could not override '[\w.]+'\.", msg):  # a plain key (a defaults-list entry has '@')
        return ("the key is not in qcls's config: check its spelling against qcls/config.py (`qcls --help` "
                "lists the groups); a group is chosen with group=option, e.g. model=qwen3_8b")
    return None
