"""Reading the docs for the doc tests: fenced blocks and their markers, links and paths, shell commands, and
shown output compared with printed output. The convention is described in tests/docs/test_docs.py and
docs/README.md ("Writing docs"). Pure functions: nothing here runs a command."""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from qcls.results import STAGES

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!--\s*doc-test:\s*(\w+)(?:\s+([\w./-]+))?\s*-->\s*$")
MARKERS = ("run", "output", "check", "file")
HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")
FENCE = re.compile(r"^(```+|~~~+)\s*([\w-]*)")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
# A backticked repository path: a top-level entry of the repository, then a path ending in a file extension.
REPO_PATH = re.compile(r"^(?:\./)?([\w.-]+/)*[\w.-]+\.(?:py|md|sh|ya?ml|json|jsonl|toml|png|csv|tsv|safetensors)$")
# Commands that install or activate an environment: a run block's test skips them (the tests run in one).
SETUP = (("pip",), ("pip3",), ("python", "-m", "pip"), ("python3", "-m", "pip"), ("python", "-m", "venv"),
         ("python3", "-m", "venv"), (".",), ("source",))
TIMED = "|".join(STAGES + ("total", "queue_wait", "in_replica", "device_wait"))
NUMBER = r"-?\d+(?:\.\d+)?"


def docs() -> list[Path]:
    """README.md (and a README_*.md draft of it) and every docs/*.md."""
    return [ROOT / "README.md", *sorted(ROOT.glob("README_*.md")), *sorted((ROOT / "docs").glob("*.md"))]


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    marker: str | None  # run | output | check | file | None
    text: str
    arg: str | None = None  # the file name of a `file` marker

    @property
    def where(self) -> str:
        name = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path.name
        return f"{name}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """Every fenced block, with the marker on the nearest non-blank line above its opening fence."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, start = m.group(1), i
        j = i + 1
        while j < len(lines) and not lines[j].startswith(fence):
            j += 1
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        mk = MARKER.match(lines[k]) if k >= 0 else None
        out.append(Block(path, start + 1, m.group(2), mk.group(1) if mk else None, "\n".join(lines[start + 1:j]),
                         mk.group(2) if mk else None))
        i = j + 1
    return out


def stray_markers(path: Path) -> list[str]:
    """Markers that name no known kind or are not followed (after blank lines) by a fence."""
    lines, bad = path.read_text(encoding="utf-8").splitlines(), []
    for n, line in enumerate(lines):
        m = MARKER.match(line)
        if not m and re.match(r"^\s*<!--\s*doc-test\b", line):
            bad.append(f"{path.name}:{n + 1}: malformed marker {line.strip()!r}")
            continue
        if not m:
            continue
        nxt = next((x for x in lines[n + 1:] if x.strip()), "")
        if m.group(1) not in MARKERS:
            bad.append(f"{path.name}:{n + 1}: unknown marker {m.group(1)!r}; known: {MARKERS}")
        elif (m.group(1) == "file") != bool(m.group(2)) or (m.group(2) or "").startswith(("/", "..")):
            bad.append(f"{path.name}:{n + 1}: `file` takes a relative file name, the other markers none")
        elif not FENCE.match(nxt):
            bad.append(f"{path.name}:{n + 1}: marker {m.group(1)!r} is not followed by a fenced block")
    return bad


def prose(path: Path) -> list[tuple[int, str]]:
    """(line number, line) outside fenced blocks."""
    out, fence = [], None
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and line.startswith(fence):
            fence = None
        elif fence is None:
            out.append((n, line))
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """Markdown link and image targets outside code (web links and in-page anchors left out)."""
    found = []
    for n, line in prose(path):
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if not re.match(r"^(https?:|mailto:|#)", target):
                found.append((n, target))
    return found


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of a file's headings: lower case, backticks and punctuation dropped, spaces → '-', and a
    heading's repeats get '-1', '-2', … in order."""
    counts: dict[str, int] = {}
    out = set()
    for _, line in prose(path):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = counts.get(slug, 0)
        counts[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def code_paths(path: Path) -> list[tuple[int, str]]:
    """Backticked repository paths in prose: a file name with an extension under a top-level directory of the
    repository (`qcls/engine/tail.py`, `bench/RESULTS.md`); read relative to the repository root."""
    tops = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}
    found = []
    for n, line in prose(path):
        for span in CODE_SPAN.findall(line):
            token = span.strip().split()[0] if span.strip() else ""
            token = token.split(":")[0]  # `qcls/backends/base.py: Backend.load`
            if REPO_PATH.match(token) and token.removeprefix("./").split("/")[0] in tops:
                found.append((n, token))
    return found


def _split_top(text: str, seps: tuple[str, ...]) -> list[str]:
    """Split at separators outside quotes, $(…) and backslash escapes."""
    parts, cur, quote, depth, i = [], "", None, 0, 0
    while i < len(text):
        c = text[i]
        if c == "\\" and quote != "'":
            cur += text[i:i + 2]
            i += 2
            continue
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif text.startswith("$(", i):
            depth += 1
        elif c == ")" and depth:
            depth -= 1
        elif depth == 0 and (sep := next((s for s in seps if text.startswith(s, i)), None)):
            parts.append(cur)
            cur, i = "", i + len(sep)
            continue
        cur += c
        i += 1
    return parts + [cur]


def logical_lines(text: str) -> list[tuple[int, str, str]]:
    """(0-based line offset, command line, heredoc body) with backslash continuations joined, blank and comment
    lines dropped, and the body of a heredoc (`<<'EOF'` … `EOF`) kept verbatim with the line that opens it."""
    out, buf, start, lines, n = [], "", 0, text.splitlines(), 0
    while n < len(lines):
        line = lines[n]
        if not buf:
            start = n
        n += 1
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        body = ""
        if (h := HEREDOC.search(buf)) and not buf.lstrip().startswith("#"):
            end = next((k for k in range(n, len(lines)) if lines[k].strip() == h.group(2)), len(lines) - 1)
            body, n = "\n".join(lines[n:end + 1]), end + 1
        if buf.strip() and not buf.lstrip().startswith("#"):
            out.append((start, buf, body))
        buf = ""
    return out


def commands(text: str) -> list[tuple[int, list[str]]]:
    """(line offset, argv) of every simple command: lines split at &&, ||, ;, | outside quotes; comments and
    leading VAR=value assignments dropped."""
    out = []
    for off, line, _ in logical_lines(text):
        for part in _split_top(line, ("&&", "||", ";", "|")):
            argv = shlex.split(part, comments=True)
            while argv and re.match(r"^[A-Za-z_]\w*=", argv[0]):
                argv = argv[1:]
            if argv:
                out.append((off, argv))
    return out


def is_setup(argv: list[str]) -> bool:
    return any(tuple(argv[:len(s)]) == s for s in SETUP)


def runnable(text: str) -> str:
    """A run block as a script without its setup steps (installs, venv creation and activation): each line's
    `&&` steps whose command is one of SETUP are dropped; the rest is kept as written."""
    keep = []
    for _, line, body in logical_lines(text):
        steps = [s for s in _split_top(line, ("&&",)) if not is_setup(shlex.split(s, comments=True))]
        if steps:
            keep.append(" && ".join(s.strip() for s in steps) + ("\n" + body if body else ""))
    return "\n".join(keep)


def _pattern(shown: str) -> tuple[re.Pattern, list[tuple[str, bool]]]:
    """A regex for one shown line: whitespace runs match any whitespace, `…` any text, each number any number
    (captured); and per captured number its shown text and whether it is a timing (after a stage name, or
    before `ms`)."""
    parts, nums = [], []
    tokens = re.findall(rf"…|{NUMBER}|\s+|[^\s…\d-]+|-", shown.strip())
    for i, tok in enumerate(tokens):
        if tok == "…":
            parts.append(".*?")
        elif re.fullmatch(NUMBER, tok):
            parts.append(f"({NUMBER})")
            before, after = "".join(tokens[:i]), "".join(tokens[i + 1:])
            nums.append((tok, bool(re.search(rf"\b({TIMED})\W{{0,3}}\s*$", before) or re.match(r"\s*ms\b", after))))
        elif tok.isspace():
            parts.append(r"\s+")
        else:
            parts.append(re.escape(tok))
    return re.compile("".join(parts)), nums


def _same_number(shown: str, printed: str) -> bool:
    if "." not in shown:
        return shown == printed
    return abs(float(shown) - float(printed)) <= 0.01


def match_output(shown: str, printed: str) -> str | None:
    """None if the printed text is what the shown block says, else the first difference. Lines `$ …` in the
    shown block (the command) are skipped; a line `…` stands for any number of printed lines; within a line
    `…` stands for any text; timings are not compared, integers must be equal and decimals within 0.01."""
    want = [ln for ln in shown.splitlines() if not ln.startswith("$ ")]
    while want and not want[-1].strip():
        want.pop()
    got = [ln for ln in printed.splitlines()]
    while got and not got[-1].strip():
        got.pop()

    def walk(i: int, j: int) -> str | None:
        while i < len(want):
            if want[i].strip() in ("…", "..."):
                return None if i + 1 == len(want) else \
                    next((None for k in range(j, len(got) + 1) if walk(i + 1, k) is None), f"nothing after line "
                         f"{j + 1} matches shown line {want[i + 1]!r}")
            if j >= len(got):
                return f"shown line {want[i]!r} has no printed line (printed {len(got)} lines)"
            pattern, nums = _pattern(want[i])
            m = pattern.fullmatch(got[j].strip())
            if not m or any(not t and not _same_number(s, p) for (s, t), p in zip(nums, m.groups())):
                return f"shown line {want[i]!r} differs from printed line {j + 1}: {got[j]!r}"
            i, j = i + 1, j + 1
        return None if j == len(got) else f"printed line {j + 1} {got[j]!r} is not shown"
    return walk(0, 0)
