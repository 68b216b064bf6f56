"""The labelled JSONL format: what is kept, what is ignored, and every refusal names file, line and reason."""
from __future__ import annotations

import json

import pytest

from qcls.config import PromptSpec
from qcls.eval.dataset import DatasetError, load_eval_set
from tests.conftest import prompt

PROMPTS = [PromptSpec(**prompt("category", ["dress", "jeans", "none"])),
           PromptSpec(**prompt("audience", ["man", "woman", "none"]))]


def write(tmp_path, lines: list, name: str = "set.jsonl"):
    f = tmp_path / name
    f.write_text("".join((x if isinstance(x, str) else json.dumps(x, ensure_ascii=False)) + "\n" for x in lines),
                 encoding="utf-8")
    return f


def row(query: str, **labels) -> dict:
    return {"query": query, "labels": labels}


def test_loads_and_ignores_prompts_the_config_lacks(tmp_path):
    f = write(tmp_path, [row("red dress", category="dress", color="red"),
                         "",  # blank lines are skipped, line numbers still count them
                         row("slim jeans men", category="jeans", audience="man"),
                         {"query": "gift", "labels": {"audience": "none"}, "note": "no category intent"},
                         row("blue", color="blue")])  # labels only a prompt the config lacks
    s = load_eval_set(f, PROMPTS)
    assert [e.query for e in s.examples] == ["red dress", "slim jeans men", "gift"]
    assert [e.line for e in s.examples] == [1, 3, 4]
    assert s.examples[0].labels == {"category": "dress"}  # color ignored
    assert s.ignored_prompts == ["color"] and s.unlabelled_lines == [5]
    assert s.counts() == {"category": 2, "audience": 2}
    assert [e.query for e in load_eval_set(f, PROMPTS, limit=2).examples] == ["red dress", "slim jeans men"]


@pytest.mark.parametrize("lines, line_no, why", [
    ([row("a", category="dress"), '{"query": "b", "labels": {"category": "dress"'], 2, "not valid JSON"),
    ([row("a", category="dress"), row("b", category="skirt")], 2, "'skirt' for prompt 'category' is not one of"),
    ([row("a", category="dress"), row("b", audience="man"), row("a", audience="man")], 3,
     "duplicate query 'a' (first on line 1)"),
    ([row("a", category="dress"), ["a", "b"]], 2, "want a JSON object"),
    ([{"labels": {"category": "dress"}}], 1, "missing field 'query'"),
    ([{"query": "a"}], 1, "missing field 'labels'"),
    ([row("", category="dress")], 1, "'query' must be a non-empty string"),
    ([{"query": 3, "labels": {"category": "dress"}}], 1, "'query' must be a non-empty string"),
    ([{"query": "a", "labels": []}], 1, "'labels' must be a non-empty object"),
    ([{"query": "a", "labels": {}}], 1, "'labels' must be a non-empty object"),
    ([{"query": "a", "labels": {"category": 1}}], 1, "gold labels must be strings"),
    ([{"query": "a", "label": {"category": "dress"}}], 1, "unknown field(s) ['label']"),
    ([row(" a", category="dress")], 1, "leading or trailing whitespace"),
])
def test_bad_lines_are_refused_with_their_line_number(tmp_path, lines, line_no, why):
    f = write(tmp_path, lines)
    with pytest.raises(DatasetError) as e:
        load_eval_set(f, PROMPTS)
    assert f"{f}:{line_no}:" in str(e.value) and why in str(e.value), str(e.value)


def test_empty_missing_and_useless_files(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(DatasetError, match="the file is empty"):
        load_eval_set(empty, PROMPTS)
    with pytest.raises(DatasetError, match="no such file"):
        load_eval_set(tmp_path / "missing.jsonl", PROMPTS)
    other = write(tmp_path, [row("a", color="red")], "other.jsonl")
    with pytest.raises(DatasetError, match=r"no line has a gold label for any of the config's prompts"):
        load_eval_set(other, PROMPTS)
    with pytest.raises(DatasetError, match="positive number"):
        load_eval_set(other, PROMPTS, limit=0)


@pytest.mark.parametrize("name, text, where", [
    ("answers.csv", "query,pred:category,pred:category:prob\nred dress,dress,0.91\n", "the header"),
    ("answers.tsv", "query\tprob:category:dress\nred dress\t0.91\n", "the header"),
    ("log.jsonl", json.dumps({"time": "2026-01-01T00:00:00Z", "query": "red dress", "pred:category": "dress"}) + "\n",
     "1"),
])
def test_a_predictions_file_is_not_a_labelled_file(tmp_path, name, text, where):
    """Columns under which qcls writes its answers (qcls/predictions/schema.py) mark a predictions file."""
    f = tmp_path / name
    f.write_text(text, encoding="utf-8")
    with pytest.raises(DatasetError, match="predictions file") as e:
        load_eval_set(f, PROMPTS)
    assert str(e.value).startswith(f"{f}{':' if where == '1' else ': '}{where}") and "qcls label-next" in str(e.value)
