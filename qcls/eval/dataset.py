"""Gold-labelled evaluation sets, checked whole before any model loads: JSONL (one query a line), or a CSV /
TSV table (qcls/eval/tables.py: a `query` column and one column per prompt name; an empty cell = no gold label).

A JSONL line is `{"query": "...", "labels": {"<prompt name>": "<gold label>", ...}}` (an optional string `note`
may say why a label was chosen). A prompt missing from `labels` is not scored for that query. Labels for
prompts that the config does not have are ignored, so a set labelled for `prompts=ecommerce8` also serves
`prompts=default`; a label outside a configured prompt's label set is refused.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from qcls.config import PromptSpec
from qcls.eval import tables

KEYS = {"query", "labels", "note"}


class DatasetError(ValueError):
    """An evaluation file that cannot be used; the message names the file, the line and the reason."""


@dataclass(frozen=True)
class Example:
    query: str
    labels: dict[str, str]  # prompt name → gold label, only for prompts of the config
    line: int  # 1-based line number in the file


@dataclass
class EvalSet:
    path: Path
    examples: list[Example]
    # prompt names found in the file but not in the config (their labels were ignored)
    ignored_prompts: list[str] = field(default_factory=list)
    # lines whose labels name none of the config's prompts (nothing to score there)
    unlabelled_lines: list[int] = field(default_factory=list)

    @property
    def queries(self) -> list[str]:
        return [e.query for e in self.examples]

    def counts(self) -> dict[str, int]:
        """Gold labels per prompt."""
        out: dict[str, int] = {}
        for e in self.examples:
            for p in e.labels:
                out[p] = out.get(p, 0) + 1
        return out


def load_eval_set(path: str | Path, prompts: Sequence[PromptSpec], limit: int | None = None) -> EvalSet:
    """Read and check a JSONL, CSV or TSV set against the config's prompts; keep the first `limit` usable
    examples."""
    path = Path(path)
    if limit is not None and limit < 1:
        raise DatasetError(f"eval limit must be a positive number of queries or null, got {limit}")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DatasetError(f"{path}: no such file (give eval.path=FILE.jsonl, .csv or .tsv)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path}: cannot be read as UTF-8 text ({e}); save it as UTF-8 (a spreadsheet's "
                           "\"CSV UTF-8\")") from None
    if tables.is_table(path):
        try:
            rows = tables.table_rows(path, text)
        except tables.TableError as e:
            raise DatasetError(str(e)) from None
        if not rows:
            raise DatasetError(f"{path}: the table has a header but no data rows")
        return _checked(path, rows, prompts, limit, tables.where)
    rows = [(no, *_parse_line(path, no, raw)) for no, raw in enumerate(text.splitlines(), start=1) if raw.strip()]
    if not rows:
        raise DatasetError(f"{path}: the file is empty (want one JSON object per line)")
    return _checked(path, rows, prompts, limit, lambda p, no: f"{p}:{no}")


def _checked(path: Path, rows: list[tuple[int, str, dict[str, str]]], prompts: Sequence[PromptSpec],
             limit: int | None, where) -> EvalSet:
    """The rows (line, query, {prompt: gold}) checked against the config's prompts, whatever the format."""
    specs = {p.name: p for p in prompts}
    examples: list[Example] = []
    ignored: set[str] = set()
    unlabelled: list[int] = []
    first_line: dict[str, int] = {}
    for no, query, labels in rows:
        _not_predictions(where(path, no), labels)
        if query in first_line:
            raise DatasetError(f"{where(path, no)}: duplicate query {query!r} (first on line {first_line[query]}); "
                               "every query must appear once")
        first_line[query] = no
        kept = {}
        for name, gold in labels.items():
            spec = specs.get(name)
            if spec is None:
                ignored.add(name)
                continue
            if gold not in spec.labels:
                raise DatasetError(f"{where(path, no)}: gold label {gold!r} for prompt {name!r} is not one of its "
                                   f"labels {spec.labels}")
            kept[name] = gold
        if not kept:
            unlabelled.append(no)
            continue
        if limit is None or len(examples) < limit:
            examples.append(Example(query, kept, no))
    if not examples:
        raise DatasetError(f"{path}: no line has a gold label for any of the config's prompts {list(specs)} "
                           f"(the file labels {sorted(ignored)}): choose prompts=... that the file labels")
    return EvalSet(path, examples, sorted(ignored), unlabelled)


def _not_predictions(where: str, names) -> None:
    """A predictions file (`qcls bulk` output, a prediction log: pred:<prompt> columns) is what the model answered,
    not gold labels: a head fitted on it would learn the model's own mistakes."""
    from qcls.predictions.schema import prediction_columns
    preds = prediction_columns(names)
    if preds:
        raise DatasetError(f"{where}: columns {preds[:3]} hold what qcls answered (a predictions file: `qcls bulk` "
                           "output or a prediction log), not gold labels; label the queries by reading them, in a file "
                           "with a `query` column and one column per prompt name (`qcls label-next` writes one to "
                           "fill in)")


def _parse_line(path: Path, no: int, raw: str) -> tuple[str, dict[str, str]]:
    where = f"{path}:{no}"
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        raise DatasetError(f"{where}: not valid JSON ({e.msg} at column {e.colno}); want one object a line "
                           'like {"query": "...", "labels": {"category": "dress"}}') from None
    if not isinstance(obj, dict):
        raise DatasetError(f"{where}: want a JSON object, got {type(obj).__name__}")
    _not_predictions(where, obj)
    unknown = sorted(set(obj) - KEYS)
    if unknown:
        raise DatasetError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(KEYS)}")
    for key in ("query", "labels"):
        if key not in obj:
            raise DatasetError(f"{where}: missing field {key!r}")
    query, labels = obj["query"], obj["labels"]
    if not isinstance(query, str) or not query.strip():
        raise DatasetError(f"{where}: 'query' must be a non-empty string, got {query!r}")
    if query != query.strip():
        raise DatasetError(f"{where}: query {query!r} has leading or trailing whitespace; strip it")
    if not isinstance(labels, dict) or not labels:
        raise DatasetError(f"{where}: 'labels' must be a non-empty object of prompt name → gold label, "
                           f"got {labels!r}")
    bad = {k: v for k, v in labels.items() if not isinstance(v, str)}
    if bad:
        raise DatasetError(f"{where}: gold labels must be strings, got {bad}")
    if "note" in obj and not isinstance(obj["note"], str):
        raise DatasetError(f"{where}: 'note' must be a string")
    return query, labels
