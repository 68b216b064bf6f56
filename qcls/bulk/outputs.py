"""Output rows and files: the result columns, one part file per chunk, the final file.

Columns: every input column (passed through), then per prompt the predictions schema's columns
(qcls/predictions/schema.py): `pred:<prompt>` (the winning label; empty when the prompt abstained, or its
threshold's fallback label), `pred:<prompt>:prob` (the most probable label's probability) and
`pred:<prompt>:abstained` (true when that probability fell short of the prompt's threshold: qcls/heads/
thresholds.py), with --all-labels `prob:<prompt>:<label>` (every label's probability), then `error` (empty for
a classified row). The `pred:` names keep the output from passing as a labelled file. JSONL keeps the input's
values as they are; CSV writes None as an empty field and a list or object as JSON; Parquet keeps a Parquet
input's column types and writes other inputs' columns as text (a JSONL value that is not a string as its JSON).
Floats are written exactly (repr), so a part read back gives the very results that were written (resume rebuilds
the cache from them).
"""
from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from qcls.errors import ConfigError
from qcls.predictions import schema
from qcls.results import QueryResult

OUTPUT_FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".tsv": "tsv", ".parquet": "parquet"}
ERROR = "error"
TABLE_PIECE = 1024  # records per Arrow conversion (Format.table)

# What the output shows of a classified query: per prompt the winner, its probability, with --all-labels
# every label's probability, and whether it abstained. The cache holds exactly this.
Result = tuple[tuple[str | None, ...], tuple[float, ...], tuple[tuple[float, ...], ...] | None, tuple[bool, ...]]


def output_format(path: str | Path) -> str:
    ext = Path(path).suffix.lower()
    if ext not in OUTPUT_FORMATS:
        raise ConfigError(f"output {path}: unknown extension {ext!r}",
                          f"name it one of {', '.join(sorted(OUTPUT_FORMATS))}")
    return OUTPUT_FORMATS[ext]


@dataclass(frozen=True)
class Columns:
    """The output's columns: `passthrough` (the input's), then the result columns of `prompts`
    ((name, labels) pairs) and `error`."""

    passthrough: tuple[str, ...]
    prompts: tuple[tuple[str, tuple[str, ...]], ...]
    all_labels: bool = False

    @classmethod
    def build(cls, passthrough: Iterable[str], prompts: Iterable[tuple[str, Iterable[str]]],
              all_labels: bool) -> "Columns":
        cols = cls(tuple(passthrough), tuple((n, tuple(labs)) for n, labs in prompts), all_labels)
        clash = sorted(set(cols.passthrough) & set(cols.result_names))
        if clash:
            raise ConfigError(f"input columns {clash} have the names of result columns",
                              "rename them in the input (result columns: pred:<prompt>, pred:<prompt>:prob, "
                              "pred:<prompt>:abstained, prob:<prompt>:<label> with --all-labels, error)")
        return cols

    @property
    def result_names(self) -> list[str]:
        out = []
        for name, labels in self.prompts:
            out += schema.prompt_columns(name, labels, self.all_labels)
        return out + [ERROR]

    @property
    def names(self) -> list[str]:
        return list(self.passthrough) + self.result_names

    def result_of(self, r: QueryResult) -> Result:
        labels = tuple(p.label for p in r.prompts)
        probs = tuple(p.prob for p in r.prompts)
        full = tuple(tuple(s.prob for s in p.labels) for p in r.prompts) if self.all_labels else None
        return labels, probs, full, tuple(p.abstained for p in r.prompts)

    def record(self, values: dict[str, Any], result: Result | None, error: str | None) -> dict[str, Any]:
        rec = dict(values)
        for i, (name, labels) in enumerate(self.prompts):
            rec[schema.label_column(name)] = result[0][i] if result else None
            rec[schema.prob_column(name)] = result[1][i] if result else None
            rec[schema.abstained_column(name)] = result[3][i] if result else None
            if self.all_labels:
                for j, lab in enumerate(labels):
                    rec[schema.label_prob_column(name, lab)] = result[2][i][j] if result else None
        rec[ERROR] = error
        return rec

    def parse(self, rec: dict[str, Any]) -> Result | None:
        """The Result a written record shows (None for an error row); CSV fields come back as text."""
        if rec.get(ERROR) not in (None, ""):
            return None
        names = [name for name, _ in self.prompts]
        labels = tuple(rec[c] if rec[c] != "" else None for c in map(schema.label_column, names))
        probs = tuple(float(rec[schema.prob_column(n)]) for n in names)
        full = tuple(tuple(float(rec[schema.label_prob_column(n, lab)]) for lab in labs) for n, labs in self.prompts) \
            if self.all_labels else None
        return labels, probs, full, tuple(rec[schema.abstained_column(n)] in (True, "true") for n in names)


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (dict, list)):
        return json.dumps(v, ensure_ascii=False)
    return str(v)


def _text(v: Any) -> str | None:
    """A pass-through value as Parquet text (a non-string JSONL value as its JSON)."""
    return v if v is None or isinstance(v, str) else json.dumps(v, ensure_ascii=False)


class Format:
    """Writing and reading back one output format's part files, and joining parts into the final file."""

    def __init__(self, fmt: str, cols: Columns, input_schema=None):
        self.fmt, self.cols = fmt, cols
        self.input_schema = input_schema  # a Parquet input's arrow schema: its columns keep their types
        self.delimiter = "\t" if fmt == "tsv" else ","

    # -- text formats
    def lines(self, records: list[dict[str, Any]]) -> str:
        if self.fmt == "jsonl":
            return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        buf = io.StringIO()
        w = csv.writer(buf, delimiter=self.delimiter, lineterminator="\n")
        names = self.cols.names
        w.writerows([_cell(r.get(c)) for c in names] for r in records)
        return buf.getvalue()

    def header(self) -> str:
        if self.fmt in ("csv", "tsv"):
            buf = io.StringIO()
            csv.writer(buf, delimiter=self.delimiter, lineterminator="\n").writerow(self.cols.names)
            return buf.getvalue()
        return ""

    # -- parquet
    def schema(self):
        import pyarrow as pa
        fields = []
        for c in self.cols.passthrough:
            src = self.input_schema.field(c) if self.input_schema is not None else None
            fields.append(src if src is not None else pa.field(c, pa.string()))
        for name, labels in self.cols.prompts:
            fields += [pa.field(schema.label_column(name), pa.string()),
                       pa.field(schema.prob_column(name), pa.float64()),
                       pa.field(schema.abstained_column(name), pa.bool_())]
            if self.cols.all_labels:
                fields += [pa.field(schema.label_prob_column(name, lab), pa.float64()) for lab in labels]
        return pa.schema(fields + [pa.field(ERROR, pa.string())])

    def table(self, records: list[dict[str, Any]]):
        """Converted in pieces of TABLE_PIECE records: Arrow holds the interpreter through each conversion, and
        a part's writer thread must not keep the thread that feeds the device waiting (one conversion of a
        65,536-row chunk stalled it for 0.2-0.4 s)."""
        import pyarrow as pa
        keep, schema = self.input_schema is not None, self.schema()
        batches = []
        for i in range(0, len(records), TABLE_PIECE):
            rows = [{c: (r.get(c) if keep else _text(r.get(c))) for c in self.cols.passthrough}
                    | {c: r[c] for c in self.cols.result_names} for r in records[i:i + TABLE_PIECE]]
            batches.append(pa.RecordBatch.from_pylist(rows, schema=schema))
        return pa.Table.from_batches(batches, schema=schema)

    # -- parts
    def write_part(self, path: Path, records: list[dict[str, Any]]) -> None:
        """Write under a temporary name, then rename: a part file that exists is complete."""
        tmp = path.with_name(path.name + ".tmp")
        if self.fmt == "parquet":
            import pyarrow.parquet as pq
            pq.write_table(self.table(records), tmp)
        else:
            with tmp.open("w", encoding="utf-8", newline="") as f:
                f.write(self.lines(records))
        os.replace(tmp, path)

    def read_part(self, path: Path) -> list[dict[str, Any]]:
        if self.fmt == "parquet":
            import pyarrow.parquet as pq
            return pq.read_table(path).to_pylist()
        with path.open("r", encoding="utf-8", newline="") as f:
            if self.fmt == "jsonl":
                return [json.loads(line) for line in f]
            return [dict(zip(self.cols.names, rec)) for rec in csv.reader(f, delimiter=self.delimiter)]

    def join(self, parts: list[Path], out: Path) -> None:
        """The final file from the parts in order, under a temporary name renamed when complete."""
        tmp = out.with_name(out.name + ".tmp")
        if self.fmt == "parquet":
            import pyarrow.parquet as pq
            with pq.ParquetWriter(tmp, self.schema()) as w:
                for p in parts:
                    w.write_table(pq.read_table(p, schema=self.schema()))
        else:
            with tmp.open("wb") as f:
                f.write(self.header().encode("utf-8"))
                for p in parts:
                    with p.open("rb") as src:
                        while block := src.read(1 << 22):
                            f.write(block)
        os.replace(tmp, out)
