"""A validation error of the composed config, told as the user's file and line: `prompts.0.lables` becomes
"my_prompts.yaml, line 7: prompts[0].lables: extra inputs are not permitted" when prompts came from that
file. The line is found by reading the file with YAML's node marks, so no second parser of our own is needed."""
from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

# the groups whose files put their content at the top level (`# @package _global_`), and those nested under
# their group's key
GLOBAL_GROUPS = ("prompts",)


def describe(e: ValidationError, sources: dict[str, Path]) -> list[str]:
    lines = []
    for err in e.errors():
        loc = [str(p) for p in err["loc"]]
        where = ".".join(loc) or "config"
        at = _position(loc, sources)
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg += " (an unknown key: check its spelling)"
        if loc == ["prompts"] and err["type"] == "list_type":
            msg += (" — a prompts file holds `prompts:` with a list of prompts; inside a config folder its first "
                    "line must be `# @package _global_` (as in the shipped qcls/conf/prompts/*.yaml)")
        lines.append(f"  {at + ': ' if at else ''}{where}: {msg}")
    return lines


def _position(loc: list[str], sources: dict[str, Path]) -> str | None:
    """`FILE, line N` of the deepest node of `loc` found in the file of its group, or None."""
    if not loc or loc[0] not in sources:
        return None
    path = sources[loc[0]]
    try:
        root = yaml.compose(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return str(path)
    # a group's file holds its keys at the top (model.yaml: `name: …`) unless it is global (`prompts: [...]`)
    keys = loc if loc[0] in GLOBAL_GROUPS else loc[1:]
    node, line = root, (root.start_mark.line if root is not None else 0)
    for k in keys:
        child = _child(node, k)
        if child is None:
            break
        node, line = child, child.start_mark.line
    return f"{path}, line {line + 1}"


def _child(node, key: str):
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if k.value == key:
                return k if not isinstance(v, (yaml.MappingNode, yaml.SequenceNode)) else v
        return None
    if isinstance(node, yaml.SequenceNode) and key.isdigit() and int(key) < len(node.value):
        return node.value[int(key)]
    return None
