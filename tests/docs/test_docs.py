"""The docs are tested: README.md and docs/*.md.

Convention (also in docs/README.md, "Writing docs"). A marker is an HTML comment on the nearest non-blank line
above a fenced block; GitHub does not render it.

    <!-- doc-test: run -->      the block below runs on the CPU demo model, in order with the file's other run
                                blocks, in one fresh temporary folder (files a block writes are there for the
                                next), with `qcls` being this checkout. Setup steps are skipped: every `&&` step
                                or line whose command is `pip …`, `python[3] -m pip|venv …`, `. FILE` or
                                `source FILE` (the test already runs inside an installed environment). A block
                                must exit 0. A heredoc (`cat > f <<'EOF'` … `EOF`) is kept verbatim.
    <!-- doc-test: output -->   the block below is what the run block above it printed on stdout (stderr, where
                                progress goes, is not compared). Lines starting with `$ ` are the command and
                                are skipped; a line `…` stands for any number of lines, `…` inside a line for
                                any text. Words must be equal (whitespace runs compare equal); integers must be
                                equal and decimals within 0.01, except timings (a number after a stage name
                                such as `forward 12.3` or `"total": 12.3`, or before `ms`), which are not compared.
    <!-- doc-test: file NAME -->  the block's text is written to NAME (relative) in the run blocks' folder before
                                the next run block: a prompt set or a CSV shown as YAML/CSV and then used.
    <!-- doc-test: check -->    the block is not run (a GPU, a server, a model this machine lacks): `bash -n`
                                checks its syntax, and every `qcls …` command in it must parse as the CLI parses
                                it and its overrides must compose and validate into a config (no weights or
                                tokenizer are read, so `model.path=/models/…` may name a missing folder).

Run blocks are checked the same way as check blocks first (fast); running them is marked slow.
Unmarked blocks (Python, YAML, JSON, shown errors) are not tested. Besides blocks: every relative link and
every backticked repository path (`qcls/engine/tail.py`) must resolve inside the repository, and nothing in
the docs or the code points outside it.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.commands import check_qcls
from tests.docs.markdown import (ROOT, anchors, blocks, code_paths, commands, docs, links, match_output, runnable,
                                 stray_markers)
from tests.forkserver import Forkserver

DOCS = docs()
# Where the repository's own docs and code must never point: a sibling folder or this machine's checkout.
OUTSIDE = re.compile(r"\.\./shared|shared/(?:design|facts)\.md|/wor[k]/|/roo[t]/|/hom[e]/\w+/")


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


def _with(marker: str) -> list[Path]:
    return [p for p in DOCS if any(b.marker == marker for b in blocks(p))]


@pytest.mark.parametrize("path", DOCS, ids=_ids(DOCS))
def test_links_resolve_inside_the_repository(path: Path) -> None:
    bad = []
    for line, target in links(path):
        file = target.split("#")[0]
        if re.match(r"^(/|~|file:|[A-Za-z]:\\)", file):
            bad.append(f"{path.name}:{line}: {target} is an absolute path; link relative to the file")
            continue
        resolved = (path.parent / file).resolve()
        if not resolved.is_relative_to(ROOT):
            bad.append(f"{path.name}:{line}: {target} points outside the repository")
        elif not resolved.exists():
            bad.append(f"{path.name}:{line}: {target} does not exist")
        elif "#" in target and resolved.suffix == ".md" and target.split("#", 1)[1] not in anchors(resolved):
            bad.append(f"{path.name}:{line}: {target}: no heading of {file} has that anchor")
    for line, token in code_paths(path):
        if not (ROOT / token).exists():
            bad.append(f"{path.name}:{line}: `{token}` is not a file of the repository (paths in backticks are "
                       "read from the repository root)")
    assert not bad, "\n".join(bad)


def test_nothing_points_outside_the_repository() -> None:
    files = DOCS + _repository_files(("py", "yaml", "sh", "toml"))
    bad = [f"{p.relative_to(ROOT)}:{n}: {line.strip()[:100]}" for p in files
           for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
           if OUTSIDE.search(line)]
    assert not bad, "these lines point outside the repository (describe it in docs/design.md instead):\n" + \
        "\n".join(bad)


def _repository_files(exts: tuple[str, ...]) -> list[Path]:
    """The repository's files with those extensions, outside hidden folders (a virtual environment is not walked)."""
    out = []
    for top, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        out += [Path(top) / n for n in names if not n.startswith(".") and n.rsplit(".", 1)[-1] in exts]
    return out


@pytest.mark.parametrize("path", DOCS, ids=_ids(DOCS))
def test_markers_are_well_formed(path: Path) -> None:
    bad = stray_markers(path)
    marked = [b for b in blocks(path) if b.marker]
    for prev, b in zip([None, *marked], marked):
        if b.marker == "output" and (prev is None or prev.marker != "run"):
            bad.append(f"{b.where}: an output block must follow a run block (the nearest marked block above it)")
        if b.marker in ("run", "check") and b.lang not in ("bash", "sh", "shell", "console"):
            bad.append(f"{b.where}: a {b.marker} block must be ```bash (it is ```{b.lang})")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", _with("check") + [p for p in _with("run") if p not in _with("check")],
                         ids=_ids(_with("check") + [p for p in _with("run") if p not in _with("check")]))
def test_command_blocks_are_valid(path: Path, tmp_path: Path, monkeypatch) -> None:
    bad = []
    monkeypatch.chdir(tmp_path)  # where the doc's file blocks are written, as the run blocks see them
    for b in blocks(path):
        if b.marker == "file":
            (tmp_path / b.arg).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / b.arg).write_text(b.text + "\n", encoding="utf-8")
        if b.marker not in ("run", "check"):
            continue
        syntax = subprocess.run(["bash", "-n"], input=b.text, capture_output=True, text=True)
        if syntax.returncode:
            bad.append(f"{b.where}: bash -n: {syntax.stderr.strip()}")
            continue
        for off, argv in commands(b.text):
            if argv[:3] in (["python", "-m", "qcls.cli"], ["python3", "-m", "qcls.cli"]):
                argv = ["qcls", *argv[3:]]
            if argv[0] != "qcls":
                continue
            try:
                check_qcls(argv[1:])
            except Exception as e:  # noqa: BLE001  (every refusal is reported with its line)
                bad.append(f"{path.name}:{b.line + 1 + off}: {' '.join(argv)[:90]}\n    {type(e).__name__}: {e}")
    assert not bad, "\n".join(bad)


def run_doc(path: Path, tmp_path: Path) -> None:
    """Run a file's run blocks in order (writing its file blocks) and compare each output block. `qcls` is this
    checkout's, each command a process forked from one that imported qcls once (tests/forkserver.py)."""
    shim = tmp_path / "bin"
    env = {**os.environ, "PATH": os.pathsep.join([str(shim), str(Path(sys.executable).parent), os.environ["PATH"]]),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    work = tmp_path / "work"
    work.mkdir(parents=True)
    if not any(b.marker == "run" and "qcls" in b.text for b in blocks(path)):
        return _run_blocks(path, work, env)
    server = Forkserver(env, tmp_path)
    try:
        server.client(shim, "qcls")
        _run_blocks(path, work, env)
    finally:
        server.close()


def _run_blocks(path: Path, work: Path, env: dict) -> None:
    printed = None
    for b in blocks(path):
        if b.marker == "run":
            proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", runnable(b.text)], cwd=work, env=env,
                                  capture_output=True, text=True, timeout=1200)
            assert proc.returncode == 0, f"{b.where}: exit status {proc.returncode}\n{proc.stderr[-3000:]}"
            printed = proc.stdout
        elif b.marker == "file":
            (work / b.arg).parent.mkdir(parents=True, exist_ok=True)
            (work / b.arg).write_text(b.text + "\n", encoding="utf-8")
        elif b.marker == "output":
            diff = match_output(b.text, printed or "")
            assert diff is None, f"{b.where}: {diff}\n--- printed:\n{printed}"


@pytest.mark.slow
@pytest.mark.parametrize("path", _with("run"), ids=_ids(_with("run")))
def test_run_blocks_print_what_the_docs_show(path: Path, tmp_path: Path) -> None:
    run_doc(path, tmp_path)


def test_the_runner_writes_files_skips_setup_and_compares_output(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- doc-test: file data/q.txt -->\n```text\nred dress\n```\n"
                   "<!-- doc-test: run -->\n```bash\npip install nothing-at-all && cat data/q.txt && "
                   "cat <<'EOF'\nscore 0.51 · forward 9.1\nEOF\n```\n"
                   "<!-- doc-test: output -->\n```text\nred dress\nscore 0.50 · forward 1.0\n```\n", encoding="utf-8")
    run_doc(doc, tmp_path / "a")  # `score` is a stage name: its number is a timing, not compared
    doc.write_text(doc.read_text(encoding="utf-8").replace("red dress\nscore", "blue dress\nscore"), encoding="utf-8")
    with pytest.raises(AssertionError, match="blue dress"):
        run_doc(doc, tmp_path / "b")
