"""Classify a labelled set and arrange the results per prompt: raw score matrices, gold indices, winners."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qcls.eval.dataset import EvalSet
from qcls.results import STAGES, QueryResult


class EvalRunError(RuntimeError):
    """The classifier refused queries of the set (e.g. longer than max_query_tokens)."""


@dataclass
class PromptScores:
    """One prompt over every query of the set (rows in set order)."""
    name: str
    labels: list[str]
    scores: np.ndarray  # [n, L] raw scores (LabelScore.score)
    tokens: np.ndarray  # [L] label token counts (LabelScore.tokens)
    gold: np.ndarray  # [n] gold label index, −1 where the query has no gold label for this prompt
    calibrated: np.ndarray | None = None  # [n, L] head logits when the config loads a head or calibration file

    @property
    def has_gold(self) -> np.ndarray:
        return self.gold >= 0

    def labelled(self) -> tuple[np.ndarray, np.ndarray]:
        """(scores, gold) of the queries with a gold label."""
        m = self.has_gold
        return self.scores[m], self.gold[m]

    @property
    def winners(self) -> np.ndarray:
        return self.scores.argmax(axis=1)


@dataclass
class Request:
    """One classify call of the set: one forward of `size` queries."""
    size: int
    ms: float  # the shared stages once + every query's own tokenize time (see request_ms)
    tokens: int  # tokens per forward (result meta)


def request_ms(results: list[QueryResult]) -> float:
    """Latency of one request from its results' timings: a query's `timings_ms["total"]` is its own tokenize
    time plus the stages its batch shares, so a request of b queries costs the shared stages once plus the
    b tokenize times (for b = 1 this is exactly `timings_ms["total"]`)."""
    shared = sum(results[0].timings_ms[s] for s in STAGES if s != "tokenize")
    return shared + sum(r.timings_ms["tokenize"] for r in results)


def classify_set(clf, data: EvalSet, batch: int | None = None) -> tuple[list[QueryResult], list[Request]]:
    """Classify in requests of `batch` queries (default engine.max_batch_size), one forward each."""
    step = batch or clf.cfg.engine.max_batch_size
    results: list[QueryResult] = []
    requests: list[Request] = []
    for i in range(0, len(data.examples), step):
        got = clf.classify(data.queries[i:i + step])
        results.extend(got)
        ok = [r for r in got if r.ok]
        if ok:
            requests.append(Request(len(ok), request_ms(ok), int(ok[0].meta.get("tokens_per_forward", 0))))
    bad = [(e, r.error) for e, r in zip(data.examples, results) if not r.ok]
    if bad:
        shown = "; ".join(f"line {e.line} {e.query!r}: {err}" for e, err in bad[:3])
        raise EvalRunError(f"{data.path}: {len(bad)} of {len(results)} queries refused by the classifier "
                           f"({shown}{' …' if len(bad) > 3 else ''}); fix those lines or raise max_query_tokens")
    return results, requests


def by_prompt(results: list[QueryResult], data: EvalSet) -> dict[str, PromptScores]:
    """Per prompt (in the results' order) the raw score matrix and gold indices of the set."""
    out: dict[str, PromptScores] = {}
    for j, pr in enumerate(results[0].prompts):
        labels = [ls.label for ls in pr.labels]
        index = {lab: i for i, lab in enumerate(labels)}
        scores = np.array([[ls.score for ls in r.prompts[j].labels] for r in results], dtype=np.float64)
        gold = np.array([index[e.labels[pr.prompt]] if pr.prompt in e.labels else -1 for e in data.examples],
                        dtype=np.int64)
        cal = None
        if pr.labels[0].head_score is not None:
            cal = np.array([[ls.head_score for ls in r.prompts[j].labels] for r in results], dtype=np.float64)
        out[pr.prompt] = PromptScores(pr.prompt, labels, scores, np.array([ls.tokens for ls in pr.labels]), gold,
                                      cal)
    return out
