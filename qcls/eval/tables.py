"""Labelled sets as spreadsheet tables: CSV (`.csv`) or TSV (`.tsv`), UTF-8 (a byte-order mark is allowed,
as spreadsheet programs write one).

The first row names the columns: `query`, then one column per prompt name whose cells are that prompt's gold
label; an optional `note` column is not read. An empty label cell means the query carries no gold label for
that prompt (as a prompt missing from a JSONL line's `labels`). Cells are stripped of surrounding whitespace;
rows whose cells are all empty are skipped. Rows are named by their line in the file, which is the row number
a spreadsheet shows (the header is row 1) unless a quoted cell spans lines.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

DELIMITERS = {".csv": ",", ".tsv": "\t"}


class TableError(ValueError):
    """A table that cannot be read as a labelled set (raised as the dataset's DatasetError by its caller)."""


def is_table(path: Path) -> bool:
    return path.suffix.lower() in DELIMITERS


def where(path: Path, line: int) -> str:
    return f"{path}: row {line}"


def table_rows(path: Path, text: str) -> tuple[list[str], list[tuple[int, str, dict[str, str]]]]:
    """(the header's columns, (line, query, {column: gold label}) of every non-empty data row); label columns with
    an empty cell are left out of the row's labels."""
    delimiter = DELIMITERS[path.suffix.lower()]
    kind = "TSV" if delimiter == "\t" else "CSV"
    reader = csv.reader(io.StringIO(text.removeprefix("\ufeff"), newline=""), delimiter=delimiter)
    header, start, out = None, 1, []
    try:
        for cells in reader:
            line, start = start, reader.line_num + 1  # the record's first line; a quoted cell may span lines
            cells = [c.strip() for c in cells]
            if not any(cells):
                continue
            if header is None:
                header = _header(path, line, cells, kind)
                continue
            out.append(_row(path, line, cells, header))
    except csv.Error as e:
        raise TableError(f"{where(path, start)}: not valid {kind} ({e})") from None
    if header is None:
        raise TableError(f"{path}: the file is empty (want a header row: query,<prompt name>,…)")
    return header, out


def _header(path: Path, line: int, cells: list[str], kind: str) -> list[str]:
    sep = "tabs" if kind == "TSV" else "commas"
    if "query" not in cells:
        raise TableError(f"{where(path, line)}: the header {cells} has no `query` column; the first row names the "
                         f"columns: query, then one column per prompt name (separated by {sep})")
    empty = [i + 1 for i, c in enumerate(cells) if not c]
    if empty:
        raise TableError(f"{where(path, line)}: header column(s) {empty} have no name; name every column "
                         "(query, a prompt name or note) or delete it")
    dup = sorted({c for c in cells if cells.count(c) > 1})
    if dup:
        raise TableError(f"{where(path, line)}: header columns {dup} appear more than once")
    return cells


def _row(path: Path, line: int, cells: list[str], header: list[str]) -> tuple[int, str, dict[str, str]]:
    if len(cells) < len(header):
        missing = header[len(cells):]
        raise TableError(f"{where(path, line)}: {len(cells)} cells, the header has {len(header)}: missing "
                         f"column(s) {missing} (leave a cell empty for no gold label, but keep its separator)")
    if len(cells) > len(header) and any(cells[len(header):]):
        raise TableError(f"{where(path, line)}: {len(cells)} cells, the header has {len(header)} columns "
                         f"{header}: quote a cell that holds the separator, or name the extra column")
    row = dict(zip(header, cells))
    query = row.pop("query")
    if not query:
        raise TableError(f"{where(path, line)}: empty query; every row needs a query (delete the row if it has "
                         "none)")
    row.pop("note", None)
    return line, query, {k: v for k, v in row.items() if v}
