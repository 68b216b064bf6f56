"""The doc tests' own machinery: what it compares, skips and splits (tests/docs/markdown.py)."""
from __future__ import annotations

from tests.docs.markdown import anchors, blocks, commands, match_output, runnable, stray_markers

PRINTED = """query: mens slim fit jeans  (4 tokens, batch 2, 190.01 ms: tokenize 0.35 · prepare 0.55 · forward 188.51)
  category  shirt      0.363   | skirt 0.340, jeans 0.060
  audience  man        1.000   | boy 0.000
"""


def test_timings_are_not_compared_but_labels_and_probabilities_are() -> None:
    shown = PRINTED.replace("190.01", "12.00").replace("188.51", "9.99").replace("0.35", "1.20")
    assert match_output("$ qcls classify …\n" + shown, PRINTED) is None
    assert match_output(PRINTED.replace("0.363", "0.366"), PRINTED) is None  # within 0.01
    assert "0.400" in match_output(PRINTED.replace("0.363", "0.400"), PRINTED)
    assert "jeans" in match_output(PRINTED.replace("category  shirt", "category  jeans"), PRINTED)
    assert match_output(PRINTED.replace("4 tokens", "5 tokens"), PRINTED) is not None  # integers exactly


def test_ellipsis_lines_and_spans() -> None:
    lines = PRINTED.splitlines()
    assert match_output("\n".join([lines[0], "…"]), PRINTED) is None
    assert match_output("\n".join(["…", lines[2]]), PRINTED) is None
    assert match_output("query: mens slim fit jeans  (…)\n…", PRINTED) is None
    assert "not shown" in match_output("\n".join(lines[:2]), PRINTED)  # a printed line the docs leave out
    assert "no printed line" in match_output(PRINTED + "  extra 1.0\n", PRINTED)


def test_setup_steps_are_dropped_from_run_blocks() -> None:
    block = ("python3 -m venv .venv && . .venv/bin/activate && pip install -q -e '.[test]' && "
             "qcls classify \"red dress\"\npip install x\necho 'a && b' | qcls repl  # comment")
    assert runnable(block) == "qcls classify \"red dress\"\necho 'a && b' | qcls repl  # comment"


def test_commands_split_at_operators_outside_quotes() -> None:
    text = ("# a comment\nRAY_ADDRESS=auto qcls serve serve.num_gpus=1\n"
            "echo \"a | b\" | qcls repl && qcls classify \\\n  scoring=exact \"x\"\n")
    assert commands(text) == [(1, ["qcls", "serve", "serve.num_gpus=1"]), (2, ["echo", "a | b"]),
                              (2, ["qcls", "repl"]), (2, ["qcls", "classify", "scoring=exact", "x"])]


def test_markers_attach_to_the_next_fence(tmp_path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text("<!-- doc-test: run -->\n\n```bash\nqcls classify a\n```\n<!-- doc-test: output -->\n"
                   "```text\nquery: a\n```\n```bash\nls\n```\n<!-- doc-test: runn -->\n```bash\n```\n"
                   "<!-- doc-test: check -->\ntext\n", encoding="utf-8")
    assert [(b.marker, b.lang, b.text) for b in blocks(doc)] == [
        ("run", "bash", "qcls classify a"), ("output", "text", "query: a"), (None, "bash", "ls"), ("runn", "bash", "")]
    assert [m.split(": ", 1)[1] for m in stray_markers(doc)] == [
        "unknown marker 'runn'; known: ('run', 'output', 'check', 'file')", "marker 'check' is not followed by a fenced block"]


def test_anchors_follow_githubs_rule(tmp_path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text("# qcls — one forward\n## latency: qwen3_4b, scoring=trie\n## latency: qwen3_4b, scoring=trie\n"
                   "```bash\n# not a heading\n```\n### `serve.ingress` (HTTP)\n<!-- doc-test run -->\n",
                   encoding="utf-8")
    assert anchors(doc) == {"qcls--one-forward", "latency-qwen3_4b-scoringtrie", "latency-qwen3_4b-scoringtrie-1",
                            "serveingress-http"}
    assert stray_markers(doc) == ["x.md:8: malformed marker '<!-- doc-test run -->'"]


def test_heredocs_are_kept_verbatim() -> None:
    block = ("pip install x && cat > p.yaml <<'EOF'\nprompts:\n  # a comment\n\n  - template: \"don't | {query}\"\nEOF\n"
             "qcls classify --config-dir . prompts=p \"x\"")
    assert runnable(block) == block.removeprefix("pip install x && ")
    assert [argv[0] for _, argv in commands(block)] == ["pip", "cat", "qcls"]


def test_file_marker_names_a_relative_file(tmp_path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text("<!-- doc-test: file conf/p.yaml -->\n```yaml\nprompts: []\n```\n"
                   "<!-- doc-test: file /etc/p.yaml -->\n```yaml\n```\n<!-- doc-test: run x -->\n```bash\n```\n",
                   encoding="utf-8")
    assert (blocks(doc)[0].marker, blocks(doc)[0].arg, blocks(doc)[0].text) == ("file", "conf/p.yaml", "prompts: []")
    assert [m.split(": ", 1)[0] for m in stray_markers(doc)] == ["x.md:5", "x.md:8"]
