"""Hydra overrides among other command-line arguments: `key=value` (with Hydra's `+`, `++`, `~` prefixes) is an
override, anything else a query or a file; what follows `--` is never an override. Shared by the `qcls` CLI and
`qcls calibrate`."""
from __future__ import annotations

import re

OVERRIDE = re.compile(r"^[+~]{0,2}[A-Za-z_][\w.@/-]*=")


def split_args(items: list[str], literal: list[str] = ()) -> tuple[list[str], list[str]]:
    """(queries, overrides): key=value items are overrides; `literal` (after `--`) are all queries."""
    overrides = [it for it in items if OVERRIDE.match(it)]
    queries = [it for it in items if not OVERRIDE.match(it)] + list(literal)
    return queries, overrides
