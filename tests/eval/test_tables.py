"""Labelled sets as CSV / TSV tables (qcls/eval/tables.py through load_eval_set): the same semantics as JSONL
(an empty cell = no gold label for that prompt, columns of other prompts ignored), and every refusal names
the file and the row."""
from __future__ import annotations

import pytest

from qcls.config import PromptSpec
from qcls.eval.dataset import DatasetError, load_eval_set
from tests.conftest import prompt

PROMPTS = [PromptSpec(**prompt("category", ["dress", "jeans", "none"])),
           PromptSpec(**prompt("audience", ["man", "woman", "none"]))]


def write(tmp_path, text: str, name: str = "set.csv", bom: bool = False):
    f = tmp_path / name
    f.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
    return f


@pytest.mark.parametrize("sep,name", [(",", "set.csv"), ("\t", "set.tsv")])
def test_reads_tables_like_jsonl(tmp_path, sep, name):
    rows = [["query", "category", "audience", "color", "note"],
            ["red dress", "dress", "woman", "red", "a note"],
            ["", "", "", "", ""],  # an empty row is skipped (its line still counts)
            ["slim jeans men", "jeans", "", "", ""],  # no gold for audience here
            ["连衣裙 女", " dress ", "woman", "", ""],  # cells are stripped
            ["blue", "", "", "blue", ""]]  # only a prompt the config lacks: unlabelled
    text = "\n".join(sep.join(r) for r in rows) + "\n"
    s = load_eval_set(write(tmp_path, text, name, bom=True), PROMPTS)
    assert [(e.line, e.query, e.labels) for e in s.examples] == [
        (2, "red dress", {"category": "dress", "audience": "woman"}),
        (4, "slim jeans men", {"category": "jeans"}),
        (5, "连衣裙 女", {"category": "dress", "audience": "woman"})]
    assert s.ignored_prompts == ["color"] and s.unlabelled_lines == [6]
    assert s.counts() == {"category": 3, "audience": 2}


def test_quoted_cells_and_a_header_without_some_prompt(tmp_path):
    """A quoted cell may hold the separator or a line break; a prompt without a column is not scored (as a
    prompt missing from every JSONL line)."""
    f = write(tmp_path, 'query,category\n"jeans, slim",jeans\n"two\nlines",dress\nlast,none\n')
    s = load_eval_set(f, PROMPTS)
    assert [(e.line, e.query) for e in s.examples] == [(2, "jeans, slim"), (3, "two\nlines"), (5, "last")]
    assert s.counts() == {"category": 3}


@pytest.mark.parametrize("text,row,why", [
    ("query,category,audience\nred dress,dress\n", 2, "2 cells, the header has 3: missing column(s) ['audience']"),
    ("query,category\nred dress,dress,woman\n", 2, "3 cells, the header has 2 columns"),
    ("query,category\nred dress,dress\n,jeans\n", 3, "empty query"),
    ("query,category\nred dress,dress\nslim jeans,skirt\n", 3, "gold label 'skirt' for prompt 'category' is not one "
                                                             "of its labels"),
    ("query,category\na,dress\nb,jeans\na,none\n", 4, "duplicate query 'a' (first on line 2)"),
    ("text,category\na,dress\n", 1, "has no `query` column"),
    ("query,category,category\na,dress,dress\n", 1, "header columns ['category'] appear more than once"),
    ("query,,category\na,,dress\n", 1, "header column(s) [2] have no name"),
])
def test_bad_rows_are_refused_naming_the_row(tmp_path, text, row, why):
    f = write(tmp_path, text)
    with pytest.raises(DatasetError) as e:
        load_eval_set(f, PROMPTS)
    assert f"{f}: row {row}:" in str(e.value) and why in str(e.value), str(e.value)


def test_empty_header_only_and_not_utf8(tmp_path):
    with pytest.raises(DatasetError, match="the file is empty"):
        load_eval_set(write(tmp_path, "\n \n", "e.tsv"), PROMPTS)
    with pytest.raises(DatasetError, match="a header but no data rows"):
        load_eval_set(write(tmp_path, "query,category\n"), PROMPTS)
    f = tmp_path / "latin1.csv"
    f.write_bytes("query,category\nrobe d'été,dress\n".encode("latin-1"))
    with pytest.raises(DatasetError, match="cannot be read as UTF-8 text.*save it as UTF-8"):
        load_eval_set(f, PROMPTS)
    with pytest.raises(DatasetError, match="no line has a gold label"):
        load_eval_set(write(tmp_path, "query,color\na,red\n"), PROMPTS)
