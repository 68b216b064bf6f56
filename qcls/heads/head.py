"""Per-prompt affine heads (docs/design.md §9–10): what a calibration or a learned head computes.

For one prompt with labels 1…L, raw label scores s [L] and, optionally, a read state f [F]:

    head logits = W_s · s + W_f · f + c        probabilities = softmax(head logits)

Temperature/bias calibration is the special case W_s = I / T, no W_f, c = b / T; a learned head is a
multinomial logistic regression on the read state (W_f), optionally with the raw scores as extra features
(W_s). The engine's tail evaluates exactly this product inside its fixed kernels; `PromptHead.apply` is the
same map in float64 for the reference path and for tests.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Sequence

import numpy as np

if TYPE_CHECKING:
    from qcls.heads.thresholds import Threshold

FINAL = "final"
KINDS = ("position", "query_mean")
READS = ("position", "query_mean", "both")


@dataclass(frozen=True)
class Tap:
    """One hidden-state vector per (query, prompt) taken in the forward: at the read position (the trie root,
    where a label would start) or the mean over the query's own tokens; after `layer` decoder layers (the
    residual stream, as transformers' hidden_states[layer]) or at FINAL (the final norm's output, what the
    LM head reads)."""
    layer: int | str
    kind: str

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"a tap's kind is one of {KINDS}, not {self.kind!r}")
        if self.layer != FINAL and not (isinstance(self.layer, int) and self.layer >= 1):
            raise ValueError(f"a tap's layer is {FINAL!r} or a layer count ≥ 1, not {self.layer!r}")
        if self.layer == FINAL and self.kind == "query_mean":
            raise ValueError("the mean over the query's tokens needs an intermediate layer (layer=N): the last "
                             "layer and the final norm run only at the positions that are read")

    @property
    def name(self) -> str:
        return f"{self.kind}@{self.layer}"


@dataclass(frozen=True)
class Read:
    """What a head reads: at which layer, and the read position, the query mean or both (concatenated in
    that order)."""
    layer: int | str = FINAL
    kind: Literal["position", "query_mean", "both"] = "position"

    def __post_init__(self):
        if self.kind not in READS:
            raise ValueError(f"head read is one of {READS}, not {self.kind!r}")
        self.taps  # noqa: B018  (building the taps validates the layer and the combination)

    @property
    def taps(self) -> list[Tap]:
        kinds = KINDS if self.kind == "both" else (self.kind,)
        return [Tap(self.layer, k) for k in kinds]

    def as_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "kind": self.kind}


@dataclass
class PromptHead:
    labels: list[str]
    bias: np.ndarray  # [L] c
    score_weights: np.ndarray | None = None  # [L, L] W_s on the raw label scores (None = not read)
    feature_weights: np.ndarray | None = None  # [L, F] W_f on the read state (None = not read)
    read: Read | None = None  # what W_f reads; set iff feature_weights is
    info: dict[str, Any] = field(default_factory=dict)  # fitting statistics (CV accuracy, C, n) for the file
    threshold: "Threshold | None" = None  # below it the prompt abstains (qcls/heads/thresholds.py)

    def __post_init__(self):
        n = len(self.labels)
        self.bias = np.asarray(self.bias, dtype=np.float64).reshape(n)
        if self.score_weights is not None:
            self.score_weights = np.asarray(self.score_weights, dtype=np.float64)
            if self.score_weights.shape != (n, n):
                raise ValueError(f"score weights of shape {self.score_weights.shape}, want ({n}, {n})")
        if (self.feature_weights is None) != (self.read is None):
            raise ValueError("feature weights and a read go together")
        if self.feature_weights is not None:
            self.feature_weights = np.asarray(self.feature_weights, dtype=np.float64)
            if self.feature_weights.ndim != 2 or self.feature_weights.shape[0] != n:
                raise ValueError(f"feature weights of shape {self.feature_weights.shape}, want ({n}, F)")

    @classmethod
    def temperature_bias(cls, labels: Sequence[str], temperature: float, bias: Sequence[float]) -> "PromptHead":
        """(score + bias) / temperature as a head."""
        n = len(labels)
        return cls(list(labels), np.asarray(bias, dtype=np.float64) / temperature, np.eye(n) / temperature)

    @property
    def is_temperature_bias(self) -> bool:
        """W_s a multiple of the identity and no features: writable as (temperature, bias)."""
        w = self.score_weights
        return (self.feature_weights is None and w is not None and w[0, 0] > 0
                and np.array_equal(w, np.eye(len(self.labels)) * w[0, 0]))

    @property
    def temperature(self) -> float:
        return 1.0 / float(self.score_weights[0, 0])

    def apply(self, scores: Sequence[float], features: np.ndarray | None = None) -> list[float]:
        """Head logits of one query in float64 (features: the read state, taps concatenated in `read` order)."""
        out = self.bias.copy()
        if self.score_weights is not None:
            out += self.score_weights @ np.asarray(scores, dtype=np.float64)
        if self.feature_weights is not None:
            if features is None:
                raise ValueError("this head reads hidden states: give the query's features")
            out += self.feature_weights @ np.asarray(features, dtype=np.float64).reshape(-1)
        return out.tolist()

    def reorder(self, labels: Sequence[str]) -> "PromptHead":
        """The same head with its rows (and score columns) in `labels` order."""
        idx = [self.labels.index(x) for x in labels]
        sw = None if self.score_weights is None else self.score_weights[np.ix_(idx, idx)]
        fw = None if self.feature_weights is None else self.feature_weights[idx]
        return PromptHead(list(labels), self.bias[idx], sw, fw, self.read, dict(self.info), self.threshold)


@dataclass
class Head:
    """Per-prompt heads (prompts without one keep their raw scores), the method that made them and the
    metadata that pins them (see qcls/heads/files.py). `variants` holds more heads of a prompt name fitted
    under other templates (a file that serves several prompt sets of one model); start-up picks, per prompt,
    the one fitted under the config's template (qcls/heads/startup.py)."""
    prompts: dict[str, PromptHead]
    method: str
    meta: dict[str, Any] = field(default_factory=dict)
    variants: dict[str, list[PromptHead]] = field(default_factory=dict)

    def candidates(self, prompt: str) -> list[PromptHead]:
        return ([self.prompts[prompt]] if prompt in self.prompts else []) + list(self.variants.get(prompt, []))

    def merged_with(self, newer: "Head") -> "Head":
        """This file's heads plus `newer`'s, a newer head replacing one fitted under the same template."""
        names = list(dict.fromkeys([*self.prompts, *self.variants, *newer.prompts]))
        prompts, variants = {}, {}
        for name in names:
            new = newer.candidates(name)
            shas = {ph.info.get("template_sha256") for ph in new}
            old = [ph for ph in self.candidates(name) if ph.info.get("template_sha256") not in shas]
            both = new + old
            prompts[name] = both[0]
            if both[1:]:
                variants[name] = both[1:]
        return Head(prompts, newer.method, dict(newer.meta), variants)

    def apply(self, prompt: str, scores: Sequence[float], features: np.ndarray | None = None) -> list[float]:
        """Head logits of one prompt; the raw scores for a prompt without a head."""
        ph = self.prompts.get(prompt)
        return [float(s) for s in scores] if ph is None else ph.apply(scores, features)

    @property
    def reads_states(self) -> bool:
        return any(ph.read is not None for ph in self.prompts.values())

    @property
    def reads_scores(self) -> bool:
        return any(ph.score_weights is not None for ph in self.prompts.values())

    def summary(self) -> dict[str, Any]:
        """What a Classifier's metadata says of it: the method and what each prompt's head reads."""
        return {"method": self.method, "reads_states": self.reads_states,
                "prompts": {n: (ph.read.as_dict() if ph.read else None) for n, ph in self.prompts.items()}}

    def save(self, path) -> None:
        """Write the head file (and its weights beside it): qcls/heads/files.py."""
        from qcls.heads.files import save
        save(self, path)

    def taps(self) -> list[Tap]:
        """Every hidden-state tap the heads read, each once, in a fixed order."""
        seen: dict[Tap, None] = {}
        for ph in self.prompts.values():
            for t in (ph.read.taps if ph.read else []):
                seen[t] = None
        return list(seen)
