"""Input files → rows. One query a line (.txt), CSV/TSV with a header, JSON lines (.jsonl), Parquet.

A row that cannot be classified (undecodable bytes, a missing or non-text query value, a JSONL line that is
not an object, a CSV record with more fields than its header) becomes a row with an error and its kind: it
never stops the run. A file that is not what its extension says (a .csv without the query column in its
header, a .jsonl whose first line is not a JSON object, a .parquet without the Parquet magic, a .txt with
NUL bytes) is refused before any model loads, naming the file and the line. Every text format is read as
bytes and decoded line by line (UTF-8), so one bad byte costs one row, not the file.

The same parsers read a file's bytes inside a Ray Data task (`parse_bytes`), so both executors make the same
rows and errors.
"""
from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator

from qcls.errors import ConfigError

TEXT_FORMATS = {".txt": "txt", ".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
INPUT_FORMATS = {**TEXT_FORMATS, ".parquet": "parquet"}
PARQUET_MAGIC = b"PAR1"
SNIFF_BYTES = 1 << 16
csv.field_size_limit(1 << 26)  # a long pass-through cell is data, not an error


@dataclass(slots=True)
class Row:
    """One input row: `line` (1-based line of a text file, row number of a Parquet file), the pass-through
    `values` (the input's columns, the query column included), the query to classify or None, and the reading
    error with its kind when there is none."""

    line: int
    values: dict[str, Any]
    query: str | None
    error: str | None = None
    kind: str | None = None


class InputError(ConfigError):
    """An input file that is not what its name says; the message names the file and the line."""


def input_format(path: str | Path) -> str:
    ext = Path(path).suffix.lower()
    if ext not in INPUT_FORMATS:
        raise ConfigError(f"input {path}: unknown extension {ext!r}",
                          f"name it one of {', '.join(sorted(INPUT_FORMATS))} (by what it holds)")
    return INPUT_FORMATS[ext]


def repaired(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def fix_text(s: str) -> tuple[str, bool]:
    """Text decoded with surrogateescape → (valid text with U+FFFD for bad bytes, whether any were bad)."""
    try:
        s.encode("utf-8")
        return s, False
    except UnicodeEncodeError:
        return s.encode("utf-8", "surrogateescape").decode("utf-8", "replace"), True


def undecodable(line: int, what: str = "the line") -> str:
    return f"undecodable bytes: {what} (line {line}) is not valid UTF-8"


# ---- per format: parsing a binary stream --------------------------------------------------------------

def _lines(f: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    for n, raw in enumerate(f, 1):
        yield n, raw.rstrip(b"\n").rstrip(b"\r")


def parse_txt(f: IO[bytes], column: str = "query") -> Iterator[Row]:
    for n, raw in _lines(f):
        if n == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            q = raw.decode("utf-8")
        except UnicodeDecodeError:
            yield Row(n, {column: repaired(raw)}, None, undecodable(n), "undecodable")
            continue
        yield Row(n, {column: q}, q)


def parse_jsonl(f: IO[bytes], column: str = "query") -> Iterator[Row]:
    for n, raw in _lines(f):
        try:
            text = raw.decode("utf-8-sig" if n == 1 else "utf-8")
        except UnicodeDecodeError:
            yield Row(n, {}, None, undecodable(n), "undecodable")
            continue
        try:
            obj = json.loads(text)
        except ValueError as e:
            yield Row(n, {}, None, f"malformed: line {n} is not JSON ({e})", "malformed")
            continue
        if not isinstance(obj, dict):
            yield Row(n, {}, None, f"malformed: line {n} is a JSON {type(obj).__name__}, not an object", "malformed")
            continue
        yield with_query(n, obj, column)


def with_query(n: int, values: dict, column: str) -> Row:
    q = values.get(column)
    if q is None:
        return Row(n, values, None, f"missing: no value in column {column!r}", "missing")
    if not isinstance(q, str):
        return Row(n, values, None, f"not text: column {column!r} holds a {type(q).__name__}", "not_text")
    return Row(n, values, q)


def parse_csv(f: IO[bytes], column: str = "query", delimiter: str = ",") -> Iterator[Row]:
    text = io.TextIOWrapper(f, encoding="utf-8-sig", errors="surrogateescape", newline="")
    reader = csv.reader(text, delimiter=delimiter)
    header: list[str] | None = None
    start = 1
    for rec in reader:
        line, start = start, reader.line_num + 1
        if header is None:
            header = [fix_text(h)[0] for h in rec]
            continue
        fixed = [fix_text(v) for v in rec]
        # a short record (a blank line has no fields) leaves the rest of the header's columns without a value
        values: dict[str, Any] = {h: (fixed[i][0] if i < len(fixed) else None) for i, h in enumerate(header)}
        if len(rec) > len(header):
            yield Row(line, values, None, f"malformed: {len(rec)} fields on line {line}, the header has "
                      f"{len(header)}", "malformed")
        elif any(bad for _, bad in fixed):
            yield Row(line, values, None, undecodable(line, "a field"), "undecodable")
        else:
            yield with_query(line, values, column)


def parse_bytes(fmt: str, data: bytes, column: str) -> Iterator[Row]:
    """Rows of a text-format file held in memory (a Ray Data read task's bytes)."""
    return parse_stream(fmt, io.BytesIO(data), column)


def parse_stream(fmt: str, f: IO[bytes], column: str) -> Iterator[Row]:
    if fmt == "txt":
        return parse_txt(f, column)
    if fmt == "jsonl":
        return parse_jsonl(f, column)
    if fmt in ("csv", "tsv"):
        return parse_csv(f, column, "\t" if fmt == "tsv" else ",")
    raise ValueError(f"no stream parser for {fmt}")


# ---- the input file: checked at start, then read in chunks ------------------------------------------

class Reader:
    """An input file checked at construction; `columns` are its pass-through columns (for a JSONL file, the
    first object's keys); `rows()` yields every row in order; `progress()` is the share read so far."""

    def __init__(self, path: str | Path, column: str | None = None):
        self.path = Path(path)
        self.fmt = input_format(self.path)
        if not self.path.is_file():
            raise ConfigError(f"input {self.path}: no such file")
        self.column = column or "query"
        self.size = self.path.stat().st_size
        self.total_rows: int | None = None
        self._pos = 0
        self.columns = self._check()

    def _refuse(self, line: int, why: str, way_out: str | None = None) -> InputError:
        return InputError(f"input {self.path} line {line}: {why}", way_out)

    def _check(self) -> list[str]:
        with self.path.open("rb") as f:
            head = f.read(SNIFF_BYTES)
        if self.fmt == "parquet":
            return self._check_parquet(head)
        if head.startswith(PARQUET_MAGIC):
            raise self._refuse(1, f"this is a Parquet file, not {self.fmt}", "name it .parquet")
        first = head.split(b"\n", 1)[0].rstrip(b"\r")
        if first.startswith(b"\xef\xbb\xbf"):
            first = first[3:]
        if b"\x00" in head:
            line = head[:head.index(b"\x00")].count(b"\n") + 1
            raise self._refuse(line, f"NUL bytes: this is not a {self.fmt} text file")
        if self.fmt == "txt":
            return [self.column]
        if self.fmt == "jsonl":
            return self._check_jsonl(head)
        if first.lstrip().startswith((b"{", b"[")):
            raise self._refuse(1, f"the header looks like JSON, not {self.fmt.upper()}", "name a JSON lines file .jsonl")
        try:
            header = next(csv.reader([first.decode("utf-8")], delimiter="\t" if self.fmt == "tsv" else ","))
        except (UnicodeDecodeError, StopIteration):
            raise self._refuse(1, f"the {self.fmt.upper()} header is empty or not UTF-8") from None
        if self.column not in header:
            raise self._refuse(1, f"no column {self.column!r} in the header {header}",
                               "name the query column with --column")
        return header

    def _check_jsonl(self, head: bytes) -> list[str]:
        for n, raw in enumerate(head.split(b"\n")[:1], 1):
            try:
                obj = json.loads(raw.decode("utf-8-sig"))
            except ValueError as e:
                raise self._refuse(n, f"not a JSON object ({e})", "a .jsonl file holds one JSON object a line") from None
            if not isinstance(obj, dict):
                raise self._refuse(n, f"a JSON {type(obj).__name__}, not an object",
                                   "a .jsonl file holds one JSON object a line")
            if self.column not in obj:
                raise self._refuse(n, f"no key {self.column!r} in the first object (keys {list(obj)})",
                                   "name the query key with --column")
            return list(obj)
        return [self.column]

    def _check_parquet(self, head: bytes) -> list[str]:
        if not head.startswith(PARQUET_MAGIC):
            raise self._refuse(1, "no Parquet magic bytes: this is not a Parquet file", "name it by what it holds")
        import pyarrow.parquet as pq
        try:
            meta = pq.ParquetFile(self.path)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a damaged file
            raise self._refuse(1, f"unreadable Parquet ({type(e).__name__}: {e})") from None
        names = meta.schema_arrow.names
        if self.column not in names:
            raise self._refuse(1, f"no column {self.column!r} (columns {names})", "name the query column with --column")
        self.total_rows = meta.metadata.num_rows
        self.schema = meta.schema_arrow
        return names

    def progress(self) -> float:
        return self._pos / max(1, self.size)

    def rows(self) -> Iterator[Row]:
        if self.fmt == "parquet":
            yield from self._parquet_rows()
            return
        with self.path.open("rb") as f:
            yield from parse_stream(self.fmt, io.BufferedReader(_Counting(f, self), 1 << 20), self.column)
        self._pos = self.size

    def _parquet_rows(self) -> Iterator[Row]:
        import pyarrow.parquet as pq
        n = 0
        pf = pq.ParquetFile(self.path)
        for batch in pf.iter_batches(batch_size=8192):
            for values in batch.to_pylist():
                n += 1
                yield with_query(n, values, self.column)
            self._pos = int(self.size * n / max(1, self.total_rows or 1))


class _Counting(io.RawIOBase):
    """A binary stream that tells its Reader how far it has read (for the ETA)."""

    def __init__(self, f: IO[bytes], owner: Reader):
        self.f, self.owner = f, owner

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = self.f.readinto(b)
        self.owner._pos = self.f.tell()
        return n


def file_identity(path: str | Path) -> dict[str, Any]:
    """What a resumed run checks its input against (same file, unchanged)."""
    st = os.stat(path)
    return {"input": str(Path(path).resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
