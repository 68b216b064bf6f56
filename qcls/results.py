"""What `Classifier.classify` returns: plain dataclasses, JSON-ready through `to_dict`."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

STAGES = ("tokenize", "prepare", "forward", "score", "postprocess")


@dataclass
class LabelScore:
    label: str
    score: float
    prob: float
    tokens: int  # label_prefix + label token count
    # with a calibration configured (else None): (score + bias) / temperature and its softmax over the labels
    calibrated_score: float | None = None
    calibrated_prob: float | None = None

    def __reduce__(self):  # positional fields: a served result pickles (Serve handle calls) at half the cost
        return LabelScore, (self.label, self.score, self.prob, self.tokens, self.calibrated_score,
                            self.calibrated_prob)


@dataclass
class PromptResult:
    prompt: str
    label: str  # the winner (by calibrated score when a calibration is configured)
    prob: float  # the winner's probability (calibrated when a calibration is configured)
    labels: list[LabelScore]  # in the prompt's label order
    raw_label: str | None = None  # with a calibration: the winner by raw score, and its raw probability
    raw_prob: float | None = None

    def __reduce__(self):
        return PromptResult, (self.prompt, self.label, self.prob, self.labels, self.raw_label, self.raw_prob)

    def top(self, k: int) -> list[LabelScore]:
        """The k best labels, by calibrated score where there is one (the order `label` was chosen by)."""
        key = (lambda s: -s.score) if self.raw_label is None else (lambda s: -s.calibrated_score)
        return sorted(self.labels, key=key)[:k]


@dataclass
class QueryResult:
    query: str
    prompts: list[PromptResult] = field(default_factory=list)
    error: str | None = None  # set when this query was refused; its prompts are then empty
    query_tokens: int = 0
    batch_size: int = 0  # queries that shared this query's forward
    timings_ms: dict[str, float] = field(default_factory=dict)  # STAGES + "total"
    meta: dict[str, Any] = field(default_factory=dict)

    def __reduce__(self):
        return QueryResult, (self.query, self.prompts, self.error, self.query_tokens, self.batch_size,
                             self.timings_ms, self.meta)

    @property
    def ok(self) -> bool:
        return self.error is None

    def winner(self, prompt: str) -> str:
        return next(p.label for p in self.prompts if p.prompt == prompt)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d
