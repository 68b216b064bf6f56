"""The import graph of qcls, drawn from the code (ast): each package imports only packages of lower layers, the
layers as docs/design.md §12 writes them (the one place they are written), and no module's top-level imports form a
cycle. An import inside a function counts; one under `if TYPE_CHECKING:` does not."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, e.g. qcls.engine.layout
    target: str  # the imported module (a package's __init__ when the name is not a module of its own)
    where: str  # file:line
    runtime: bool  # False under `if TYPE_CHECKING:`
    top: bool  # at the module's top level, not inside a function


def _module(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(root: Path) -> list[Import]:
    """Every import of a `qcls` module by a module under root/qcls."""
    files = sorted((root / "qcls").rglob("*.py"))
    modules = {_module(f, root) for f in files}
    found: list[Import] = []
    for f in files:
        source = _module(f, root)
        package = source if f.name == "__init__.py" else source.rpartition(".")[0]

        def visit(node: ast.AST, runtime: bool, top: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and _type_checking(child.test):
                    for st in child.body:
                        visit_one(st, False, top)
                    for st in child.orelse:
                        visit_one(st, runtime, top)
                    continue
                visit_one(child, runtime, top)

        def visit_one(child: ast.AST, runtime: bool, top: bool) -> None:
            if isinstance(child, ast.Import):
                targets = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[:len(package.split(".")) - child.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in child.names]
            else:
                inner = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                visit(child, runtime, inner)
                return
            for t in dict.fromkeys(targets):
                if t == "qcls" or t.startswith("qcls."):
                    found.append(Import(source, t, f"{f.relative_to(root)}:{child.lineno}", runtime, top))

        visit(ast.parse(f.read_text(encoding="utf-8")), True, True)
    return found


def package(module: str) -> str:
    """qcls.engine.layout → engine; qcls.classifier (a module at the top of qcls/) → classifier."""
    return module.split(".")[1] if "." in module else module


def layers(doc: Path = DESIGN) -> dict[str, int]:
    """Package → layer, from the table of the design's section 12."""
    section = doc.read_text(encoding="utf-8").split("\n## 12.", 1)[1].split("\n## ", 1)[0]
    out = {}
    for layer, names in re.findall(r"^\| (\d+) \| ([^|]+) \|", section, flags=re.M):
        for name in re.findall(r"`([\w.]+)`", names):
            out[name] = int(layer)
    return out


def upward(found: list[Import], layer: dict[str, int]) -> list[str]:
    """Runtime imports of a package of the importer's own layer or above."""
    bad = []
    for i in found:
        a, b = package(i.source), package(i.target)
        if i.runtime and a != b and "qcls" not in (a, b) and layer[b] >= layer[a]:
            bad.append(f"{i.where}: {a} (layer {layer[a]}) imports {i.target} (layer {layer[b]})")
    return bad


def cycles(found: list[Import]) -> list[list[str]]:
    """Cycles among the modules' top-level runtime imports (strongly connected components of two or more)."""
    graph: dict[str, set[str]] = {}
    for i in found:
        if i.runtime and i.top and i.source != i.target:
            graph.setdefault(i.source, set()).add(i.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def test_every_package_has_one_layer_and_every_layer_names_a_package():
    layer = layers()
    code = {package(i.source) for i in imports(ROOT)} | {package(i.target) for i in imports(ROOT)}
    code -= {"qcls"}  # the top package's __init__ only names the public entry points
    assert code == set(layer), (f"packages without a row in docs/design.md §12: {sorted(code - set(layer))}; "
                                f"rows naming no package: {sorted(set(layer) - code)}")


def test_packages_import_only_lower_layers():
    assert upward(imports(ROOT), layers()) == []


def test_no_cycle_among_top_level_imports():
    assert cycles(imports(ROOT)) == []


def test_the_graph_finds_an_upward_import_and_a_cycle_but_not_a_type_only_import(tmp_path):
    files = {
        "qcls/__init__.py": "",
        "qcls/low/__init__.py": "",
        "qcls/low/a.py": "from qcls.low import b\n\ndef f():\n    from qcls.high import c\n",
        "qcls/low/b.py": "from typing import TYPE_CHECKING\nfrom . import a\nif TYPE_CHECKING:\n    from qcls.high.c import C\n",
        "qcls/high/__init__.py": "",
        "qcls/high/c.py": "import qcls.low.a\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = imports(tmp_path)
    assert upward(found, {"low": 1, "high": 2}) == ["qcls/low/a.py:4: low (layer 1) imports qcls.high.c (layer 2)"]
    assert upward(found, {"low": 2, "high": 2}) != []  # a package of the same layer is refused too
    assert cycles(found) == [["qcls.low.a", "qcls.low.b"]]
    assert [i.runtime for i in found if i.source == "qcls.low.b"] == [True, False]
