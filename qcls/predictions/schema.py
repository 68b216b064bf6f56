"""The predictions schema: the names of the columns under which qcls writes what it answered, shared by `qcls bulk`'s
output and the serving prediction log, so that one reader reads both.

Per prompt `p`: `pred:p` (the winning label; empty when the prompt abstained without a fallback), `pred:p:prob`
(the most probable label's probability), `pred:p:abstained`, and where every label is kept `prob:p:<label>`.
A log row adds `time` (UTC, ISO 8601), `fingerprint` (which configuration answered: qcls/results/answer_fingerprint.py),
`cache_hit` and `latency_ms`. The `pred:` prefix is what keeps a predictions file from passing as a labelled file,
whose per-prompt columns are the bare prompt names: a head fitted on the model's own answers learns nothing.
"""
from __future__ import annotations

from typing import Iterable

PRED = "pred:"
PROB = "prob:"
QUERY = "query"
LOG_FIELDS = ("time", QUERY, "fingerprint", "cache_hit", "latency_ms")


def label_column(prompt: str) -> str:
    return f"{PRED}{prompt}"


def prob_column(prompt: str) -> str:
    return f"{PRED}{prompt}:prob"


def abstained_column(prompt: str) -> str:
    return f"{PRED}{prompt}:abstained"


def label_prob_column(prompt: str, label: str) -> str:
    return f"{PROB}{prompt}:{label}"


def prompt_columns(prompt: str, labels: Iterable[str] = (), all_labels: bool = False) -> list[str]:
    """One prompt's prediction columns, in the order they are written."""
    out = [label_column(prompt), prob_column(prompt), abstained_column(prompt)]
    return out + ([label_prob_column(prompt, lab) for lab in labels] if all_labels else [])


def is_prediction_column(name: str) -> bool:
    return name.startswith((PRED, PROB))


def prediction_columns(names: Iterable[str]) -> list[str]:
    """The columns among `names` that hold predictions: a file with any is a predictions file."""
    return [n for n in names if is_prediction_column(n)]
