"""A pool of queries to choose from, with how often each was asked: a prediction-log folder, a `qcls bulk`
output, or any query file.

- A **folder** is a prediction log: its parts `*.jsonl` (and `*.parquet`, read with pyarrow) are read in name
  order, each row one request. A part must hold the log's columns (`query` and `pred:<prompt>` ones:
  qcls/predictions/schema.py); a part that does not (a file from elsewhere) or that has a row that is not a JSON
  object (a part cut short by a crash) is refused, naming the file and the row. Parts written under different configurations (before and
  after a reload) are read alike: only the queries are used.
- A **file** is read as `qcls bulk` reads its input (qcls/query_files.py: `.txt` one query a line, `.csv` /
  `.tsv` with a header, `.jsonl`, `.parquet`), the query in column `query` or the one named; a bulk output
  keeps its input's query column, so the same name reads it. Rows without a query are skipped and counted.

Queries that are equal once case-folded and with whitespace runs collapsed (`normalised`) are one query: it
keeps its most frequent spelling (the first seen on a tie) and the sum of the counts.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from qcls.query_files import Reader
from qcls.errors import ConfigError, missing_package
from qcls.predictions.schema import QUERY, prediction_columns

PARTS = ("*.jsonl", "*.parquet")


class PoolError(ConfigError):
    """A pool that cannot be read; the message names the file (and row) and the way out."""


@dataclass
class Pool:
    path: Path
    kind: str  # "prediction log", "predictions file" or "query file"
    queries: list[str]  # distinct by normalised(), in order of first appearance
    counts: list[int]
    rows: int  # rows read (requests, for a log)
    skipped: int = 0  # rows without a query
    files: list[Path] = field(default_factory=list)


def normalised(query: str) -> str:
    """What makes two spellings one query: case folded, whitespace runs collapsed to one space, ends stripped."""
    return " ".join(query.casefold().split())


def read_pool(path: str | Path, column: str | None = None) -> Pool:
    path = Path(path)
    if path.is_dir():
        return _log(path)
    if not path.is_file():
        raise PoolError(f"pool {path}: no such file or folder",
                        "give a prediction-log folder, a `qcls bulk` output or a query file (.txt, .csv, .jsonl)")
    reader = _reader(path, column)
    kind = "predictions file" if prediction_columns(reader.columns) else "query file"
    return _grouped(path, kind, [path], _queries(reader, strict=False))


def _log(folder: Path) -> Pool:
    parts = sorted(p for pattern in PARTS for p in folder.glob(pattern) if not p.name.startswith("."))
    if not parts:
        raise PoolError(f"pool {folder}: a folder without prediction-log parts (*.jsonl, *.parquet)",
                        "give the folder the prediction log writes to, or a query file")
    found: list[tuple[str | None, int]] = []
    for part in parts:
        reader = _reader(part, QUERY, f"move {part} out of the folder: a log's parts are the files it wrote")
        if not prediction_columns(reader.columns):
            raise PoolError(f"pool {folder}: {part.name} is not a prediction-log part (its columns "
                            f"{reader.columns[:8]} have no pred:<prompt> column)",
                            f"move {part} out of the folder, or give a query file as the pool instead of the folder")
        found += _queries(reader, strict=True)
    return _grouped(folder, "prediction log", parts, found)


def _reader(path: Path, column: str | None, way_out: str | None = None):
    try:
        return Reader(path, column or QUERY)
    except ImportError as e:  # a Parquet part without pyarrow
        raise missing_package(e, f"reading {path}") or e
    except ConfigError as e:  # the bulk reader's refusal (InputError, an unknown extension)
        raise PoolError(f"pool {e.what.removeprefix('input ')}", way_out or e.way_out or "give a query file: .txt "
                        "(one query a line), or .csv / .jsonl / .parquet with a query column") from None


def _queries(reader, strict: bool) -> list[tuple[str | None, int]]:
    """(query or None, line) of every row; `strict` (a log part): a row that is not a JSON object is refused."""
    out = []
    for row in reader.rows():
        if strict and row.kind in ("malformed", "undecodable"):
            raise PoolError(f"pool {reader.path} line {row.line}: {row.error} (a part cut short by a crash, or not "
                            "one the log wrote)", f"move {reader.path} out of the folder (or delete line {row.line} "
                            "from it) and run again")
        q = row.query.strip() if row.query is not None else ""
        out.append((q or None, row.line))
    return out


def _grouped(path: Path, kind: str, files: list[Path], rows: list[tuple[str | None, int]]) -> Pool:
    spellings: dict[str, Counter] = {}
    for q, _ in rows:
        if q is not None:
            spellings.setdefault(normalised(q), Counter())[q] += 1
    queries, counts = [], []
    for forms in spellings.values():  # Counter keeps first-seen order: most_common breaks ties by it
        queries.append(forms.most_common(1)[0][0])
        counts.append(sum(forms.values()))
    return Pool(path, kind, queries, counts, len(rows), sum(q is None for q, _ in rows), files)
