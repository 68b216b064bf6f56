"""The HTTP API's request and response bodies. Unknown fields are refused so a typo is an error, not a no-op.

Inside the replica results stay `qcls.results` dataclasses; these models only shape them on the wire.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator

from qcls.results import QueryResult


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ClassifyRequest(_Body):
    """Exactly one of `query` or `queries`."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "examples": [{"query": "red cotton hoodie for boys"}, {"queries": ["maxi dress", "slim jeans men"]},
                     {"query": "maxi dress", "compact": True}]})

    query: str | None = Field(default=None, description="one query")
    queries: list[str] | None = Field(default=None, description="several queries (at most "
                                      "max_queries_per_request); each is batched with concurrent requests")
    compact: bool = Field(default=False, description="answer with each prompt's winner and its probability "
                          "only (CompactClassifyResponse): a smaller body, cheaper to write and read")

    @model_validator(mode="after")
    def _one_of(self, info: ValidationInfo) -> "ClassifyRequest":
        if (self.query is None) == (self.queries is None):
            raise ValueError('give exactly one of "query" (a string) or "queries" (a list of strings)')
        limit = (info.context or {}).get("max_queries")
        if self.queries is not None:
            if not self.queries:
                raise ValueError('"queries" is empty: give at least one query')
            if limit and len(self.queries) > limit:
                raise ValueError(f'"queries" has {len(self.queries)} queries, over max_queries_per_request='
                                 f'{limit}: split them over several requests')
        return self

    @property
    def query_list(self) -> list[str]:
        return [self.query] if self.query is not None else list(self.queries or [])


class LabelOut(_Body):
    label: str
    score: float | None = Field(description="the LLM's score of the label under the scoring strategy (a "
                                "log-probability), with or without a head; null where the forward stops at a head's layer "
                                "(meta.layers: no label scores are computed there)")
    prob: float | None = Field(description="the label's probability: the head's softmax with a head or calibration "
                               "(calibration=FILE), else the softmax of the scores over this prompt's labels")
    tokens: int = Field(description="tokens of label_prefix + label")
    raw_prob: float | None = Field(default=None, description="with a head or calibration: softmax of the raw scores")
    head_score: float | None = Field(default=None, description="with a head or calibration: the head's logit "
                                     "((score + bias) / temperature for a calibration)")


class CompactPromptOut(_Body):
    prompt: str
    label: str | None = Field(description="the winner; null (or the fallback label) when the prompt abstained")
    prob: float | None = Field(description="the most probable label's probability")
    raw_label: str | None = Field(default=None, description="with a head or calibration: the winner by raw score")
    raw_prob: float | None = Field(default=None, description="with a head or calibration: the raw winner's "
                                   "probability")
    abstained: bool = Field(default=False, description="the most probable label's probability fell short of "
                            "the prompt's threshold (the head file's `threshold`): `label` is then null, or the "
                            "threshold's fallback label, and `prob` is the most probable label's probability")


class PromptOut(CompactPromptOut):
    labels: list[LabelOut] = Field(description="every label, in the prompt's label order")


class QueryOut(_Body):
    query: str
    ok: bool
    error: str | None = Field(description="why this query was not classified (then `prompts` is empty)")
    query_tokens: int
    batch_size: int = Field(description="queries that shared this query's forward")
    timings_ms: dict[str, float] = Field(description="engine stages (tokenize, prepare, forward, score, "
                                         "postprocess), their total, queue_wait (arrival at the replica to "
                                         "the batch's start) and in_replica (arrival to result)")
    prompts: list[PromptOut]
    meta: dict[str, Any]

    @classmethod
    def of(cls, r: QueryResult) -> "QueryOut":
        return cls.model_validate(r.to_dict())


def fingerprint_field():
    return Field(default=None, description="the configuration that answered: a short hash of the model, backend, "
                 "prompts, strategy and head file (it changes with a reload; results' meta.fingerprint)")


class ClassifyResponse(_Body):
    model: str
    fingerprint: str | None = fingerprint_field()
    results: list[QueryOut] = Field(description="one per query, in request order")


class CompactQueryOut(_Body):
    query: str
    ok: bool
    error: str | None
    batch_size: int
    timings_ms: dict[str, float]
    prompts: list[CompactPromptOut]


class CompactClassifyResponse(_Body):
    model: str
    fingerprint: str | None = fingerprint_field()
    results: list[CompactQueryOut] = Field(description="one per query, in request order")


class ErrorResponse(_Body):
    detail: str = Field(description="what was wrong, naming the limit where one applies")
    errors: list[str] | None = Field(default=None, description="every problem found, one per line")
    results: list[QueryOut] | None = Field(default=None, description="per-query results when no query "
                                           "could be classified")


class PromptInfo(_Body):
    name: str
    labels: list[str]


class ReloadInfo(_Body):
    """How the replica that answered stands with reloads (qcls/deployments/reload.py)."""

    status: Literal["serving", "building", "refused"] = Field(description="serving: the last reload (if any) "
                                                               "answers; building: it is being built and the old "
                                                               "configuration answers; refused: `detail` says why, "
                                                               "the old configuration answers")
    fingerprint: str = Field(description="the configuration answering now")
    prompts: list[str]
    request_id: str | None = Field(default=None, description="the last reload request's id (`qcls reload` sets one)")
    detail: str | None = Field(default=None, description="why the last reload was refused")
    last_refusal: str | None = Field(default=None, description="the latest refusal and its Unix time, kept until a "
                                     "new configuration serves")
    since: float = Field(description="when this state began (Unix time)")
    replica: str = Field(description="host:pid of the replica")


class PromptsResponse(_Body):
    model: str
    strategy: str
    fingerprint: str = Field(description="the active configuration (results' meta.fingerprint)")
    prompts: list[PromptInfo]
    reload: ReloadInfo


class HealthResponse(_Body):
    status: Literal["ok", "unhealthy"]
    model: str
    device: str
    detail: str | None = None


def validation_messages(e: ValidationError) -> list[str]:
    """pydantic's errors as `field: message` lines a client can act on."""
    out = []
    for err in e.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field; the accepted fields are 'query', 'queries' and 'compact'"
        out.append(f"{where}: {msg}" if where else msg)
    return out


def is_json_error(e: ValidationError) -> bool:
    return any(err["type"] == "json_invalid" for err in e.errors(include_url=False))
