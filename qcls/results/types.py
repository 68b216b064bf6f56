"""What `Classifier.classify` returns: plain dataclasses, JSON-ready through `to_dict`."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

STAGES = ("tokenize", "prepare", "forward", "score", "postprocess")


@dataclass(slots=True)
class LabelScore:
    label: str
    # the LLM's own score of the label under the scoring strategy (always the raw one); None where the forward
    # stops at the heads' layer and computes no label score (meta["layers"])
    score: float | None
    prob: float  # the probability qcls reports: the head's with a head or calibration, else softmax(scores)
    tokens: int  # label_prefix + label token count
    # with a head or calibration (calibration=FILE; else None): softmax of the raw scores, and the head's logit
    raw_prob: float | None = None
    head_score: float | None = None

    def __reduce__(self):  # positional fields: a served result pickles (Serve handle calls) at half the cost
        return LabelScore, (self.label, self.score, self.prob, self.tokens, self.raw_prob, self.head_score)


@dataclass(slots=True)
class PromptResult:
    prompt: str
    # the winner (the head's, when a head or calibration is configured); None (or the threshold's fallback
    # label) when the prompt abstained
    label: str | None
    prob: float  # the most probable label's probability (the head's, when one is configured)
    labels: list[LabelScore]  # in the prompt's label order
    raw_label: str | None = None  # with a head or calibration: the winner by raw score, and its raw probability
    raw_prob: float | None = None
    # the most probable label fell short of the prompt's threshold (qcls/heads/thresholds.py): no answer given
    abstained: bool = False

    def __reduce__(self):
        return PromptResult, (self.prompt, self.label, self.prob, self.labels, self.raw_label, self.raw_prob,
                              self.abstained)

    def top(self, k: int) -> list[LabelScore]:
        """The k most probable labels (the order `label` was chosen by)."""
        return sorted(self.labels, key=lambda s: -s.prob)[:k]


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
