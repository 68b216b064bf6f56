"""Commit hashes where a reader reads: README.md, docs/, the package (code, comments, YAML, data notes), the tests
and the bench scripts. A figure cites bench/README.md's current-figures table, which names each run's commit once;
bench/RESULTS.md keeps the history. Neither of those two files is walked.

    python -m tests.docs.commit_refs      # every line naming a commit of this checkout; exit 1 if any

A candidate is a run of 7 to 40 hex digits standing alone (not part of a longer word or hash); git says which
candidates name a commit (`git cat-file --batch-check`, one process for all of them).
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEX = re.compile(r"(?<![0-9A-Za-z_])[0-9a-fA-F]{7,40}(?![0-9A-Za-z_])")


def walked() -> list[Path]:
    """README.md, docs/*.md, every text file under qcls/ and tests/, bench/*.py and bench/device.sh."""
    trees = [p for top in ("qcls", "tests") for p in (ROOT / top).rglob("*")
             if p.is_file() and "__pycache__" not in p.parts]
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(trees),
            *sorted((ROOT / "bench").glob("*.py")), ROOT / "bench" / "device.sh"]


def in_git_checkout() -> str | None:
    """None where git answers for ROOT, else why not."""
    try:
        run = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-inside-work-tree"], capture_output=True,
                             text=True)
    except OSError as e:
        return f"no git: {e}"
    return None if run.stdout.strip() == "true" else f"{ROOT} is not a git checkout"


def candidates(paths: list[Path]) -> list[tuple[Path, int, str, str]]:
    """(file, line number, token, line) of every hex run in the text files among `paths` (binary files skipped)."""
    out = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            out += [(path, n, m.group(0), line) for m in HEX.finditer(line)]
    return out


def commits(tokens: set[str]) -> set[str]:
    """The tokens git resolves to a commit of this repository."""
    ordered = sorted(tokens)
    answer = subprocess.run(["git", "-C", str(ROOT), "cat-file", "--batch-check"], capture_output=True, text=True,
                            input="".join(f"{t}^{{commit}}\n" for t in ordered), check=True).stdout.splitlines()
    return {t for t, a in zip(ordered, answer) if not a.endswith((" missing", " ambiguous"))}


def findings(paths: list[Path]) -> list[str]:
    """'file:line: token: the line' for every commit named in `paths`."""
    found = candidates(paths)
    named = commits({t for _, _, t, _ in found})
    return [f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}:{n}: {t}: {line.strip()[:120]}"
            for p, n, t, line in found if t in named]


def main() -> int:
    why = in_git_checkout()
    if why:
        print(f"not checked: {why}")
        return 0
    bad = findings(walked())
    print("\n".join(bad) if bad else "no commit named in README.md, docs/, qcls/, tests/ or the bench scripts")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
