"""Where the API key comes from, first found: `serve.api_key` (in the config: visible wherever the config is), the
file `serve.api_key_file` (its first line; read by each replica, so on a cluster it must exist on every node), or
the environment variable QCLS_API_KEY (of the replica process: `qcls serve` passes its own environment to the Ray it
starts; on a cluster set it before `ray start`). No key: the API is open, which `qcls serve` warns of on an address
other than loopback. The replica's check of the key: qcls/deployments/api_key.py.
"""
from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from qcls.config.schema import ServeSpec
from qcls.errors import ConfigError

ENV_API_KEY = "QCLS_API_KEY"


def resolve_api_key(serve: ServeSpec) -> str | None:
    """The key `serve` and this process's environment configure, or None (no key: open)."""
    if serve.api_key is not None:
        key, where = serve.api_key, "serve.api_key"
    elif serve.api_key_file is not None:
        path = Path(serve.api_key_file).expanduser()
        try:
            key = path.read_text(encoding="utf-8").splitlines()[0] if path.stat().st_size else ""
        except OSError as e:
            raise ConfigError(f"serve.api_key_file={serve.api_key_file!r} cannot be read ({e.strerror or e})",
                              "give a readable file whose first line is the key (on every node of a cluster), "
                              f"or set {ENV_API_KEY}") from None
        where = f"serve.api_key_file={serve.api_key_file}"
    else:
        key, where = os.environ.get(ENV_API_KEY), ENV_API_KEY
        if key is None:
            return None
    key = key.strip()
    if not key:
        raise ConfigError(f"{where} gives an empty API key", "give a non-empty key, or none to leave the API open")
    return key


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def open_to_the_network(serve: ServeSpec) -> str | None:
    """The start-up warning for an address other than loopback without a key, or None."""
    if is_loopback(serve.host) or resolve_api_key(serve) is not None:
        return None
    return (f"serving on {serve.host} without an API key: anyone who can reach this address can use it; set "
            f"{ENV_API_KEY}, serve.api_key_file=FILE or serve.api_key=KEY")
