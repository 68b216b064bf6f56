"""Abstention thresholds: per prompt the least probability its winner needs before qcls answers.

A prompt's threshold rides in the head file beside the head it was fitted for (qcls/heads/files.py, the
prompt entry's `threshold` key), so whatever loads or reloads that file serves the thresholds with it:

    threshold:
      min_prob: 0.62                 # the winner's probability must be ≥ this …
      labels: {jeans: 0.8}           # … or ≥ this when the winner is one of these labels (optional)
      fallback: none                 # the label an abstaining prompt reports (optional; default: no label)
      fitted: {target_precision: 0.95, precision: 0.951, coverage: 0.62, n: 151, on: …}   # how it was chosen

Applied on the host while results are built (`apply`): a prompt whose winner falls short keeps every label's
probability, is marked `abstained` and reports no winner (or the fallback).

Fitting (`fit_precision`, `fit_coverage`) works on one prompt's winner probabilities and whether each winner
was right, from held-out predictions (nested out-of-fold for a head: qcls/fitting/nested.py). The candidate
thresholds are the distinct winner probabilities; threshold t answers the queries whose winner probability is
≥ t (its coverage) and its precision is the share of those answered correctly. For a target precision P at a
confidence c the threshold chosen is the LOWEST candidate whose answered queries' precision has a one-sided
Clopper–Pearson lower bound ≥ P at c (qcls/heads/bounds.py): of all thresholds the split certifies it answers
the most queries. The point estimate reaching P is not enough: on new queries it would fall under P about as often
as over it. Precision need not rise with t, so higher candidates may fall below again; the one chosen is
certified on the fitting split. When that is the lowest candidate (every query answered is certified already)
the threshold is 0: nothing needs to abstain, and a held-out query less confident than any fitting query is not
refused for it. When no candidate is certified the fit says so (`reached` False, the best precision and bound
any threshold gives, and how many more labelled queries of the prompt would certify P if the best observed
error rate held: `more_needed`) and no threshold is chosen: the target is never silently relaxed.
`confidence=None` is the point-estimate rule (the lowest threshold whose observed precision reaches P), kept
for comparison (bench/nested_cv.py). For a target coverage the threshold chosen is the HIGHEST candidate whose
coverage is ≥ the target (ties in probability may make the coverage exceed it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Iterable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

CONFIDENCE = 0.9  # the default confidence a target precision is certified at (--confidence)


@dataclass(frozen=True)
class Threshold:
    min_prob: float
    labels: dict[str, float] = field(default_factory=dict)  # per winner label, instead of min_prob
    fallback: str | None = None
    fitted: dict[str, Any] = field(default_factory=dict)  # the fit's target and statistics (for the file)

    def __post_init__(self):
        for what, v in [("min_prob", self.min_prob), *((f"labels.{k}", v) for k, v in self.labels.items())]:
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"threshold {what} = {v}: a probability between 0 and 1")

    def needed(self, label: str) -> float:
        return self.labels.get(label, self.min_prob)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"min_prob": float(self.min_prob)}
        if self.labels:
            out["labels"] = {k: float(v) for k, v in self.labels.items()}
        if self.fallback is not None:
            out["fallback"] = self.fallback
        if self.fitted:
            out["fitted"] = dict(self.fitted)
        return out


class ThresholdEntry(BaseModel):
    """A prompt entry's `threshold` in the head file (qcls/heads/files.py)."""
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    min_prob: float = Field(ge=0, le=1)
    labels: dict[str, Annotated[float, Field(ge=0, le=1)]] = Field(default_factory=dict)
    fallback: str | None = None
    fitted: dict[str, Any] = Field(default_factory=dict)


def threshold_of(t: ThresholdEntry | None, labels: list[str], where: str) -> Threshold | None:
    """The prompt's threshold (None: it always answers); per-label thresholds must name its labels."""
    from qcls.heads.files import CalibrationError
    if t is None:
        return None
    unknown = sorted(set(t.labels) - set(labels))
    if unknown:
        raise CalibrationError(f"{where}: threshold.labels names {unknown}, which are not among its labels "
                               f"{labels}", "fix the label names or drop those entries")
    return Threshold(t.min_prob, dict(t.labels), t.fallback, dict(t.fitted))


def described(t: Threshold) -> str:
    """One line on a threshold and the promise it was fitted for: '≥ 0.5870 (precision ≥ 0.95 certified at 90 %
    confidence: lower bound 0.953 on 123 answered of n=151)'."""
    f = t.fitted
    out = f"≥ {t.min_prob:.4f}" + (f" (per label: {t.labels})" if t.labels else "")
    if "target_precision" in f:
        if f.get("confidence") is not None and f.get("lower_bound") is not None:
            out += (f" (precision ≥ {f['target_precision']} certified at {f['confidence']:.0%} confidence: lower bound "
                    f"{f['lower_bound']:.3f} on {f.get('answered', '?')} answered of n={f.get('n', '?')})")
        else:
            out += f" (precision ≥ {f['target_precision']} observed on n={f.get('n', '?')}, no confidence bound)"
    elif "target_coverage" in f:
        out += f" (coverage ≥ {f['target_coverage']} on n={f.get('n', '?')})"
    return out


def startup_line(head, prompts: list[str]) -> str | None:
    """'[qcls] abstention thresholds: …' per prompt of the served head (None when no prompt has one)."""
    limits = limits_of(head, prompts)
    if all(t is None for t in limits):
        return None
    return "[qcls] abstention thresholds: " + "; ".join(
        f"{n}: {described(t) if t else 'none (answers every query)'}" for n, t in zip(prompts, limits))


def limits_of(head, prompts: list[str]) -> list[Threshold | None]:
    """Per prompt name, in order, the threshold of `head` (the served Head, or None), or None where it always
    answers: resolved once, when a Classifier is built."""
    entries = head.prompts if head is not None else {}
    return [entries[n].threshold if n in entries else None for n in prompts]


def apply(prompts: Iterable, limits: list[Threshold | None]) -> None:
    """Mark the PromptResults whose winner falls short of their threshold (in place); `limits`: limits_of's list,
    one per result in the same order."""
    for r, t in zip(prompts, limits):
        if t is None or r.label is None or r.prob is None or r.prob >= t.needed(r.label):
            continue
        r.label, r.abstained = t.fallback, True


@dataclass
class Curve:
    """Precision and coverage of every candidate threshold, highest first (one prompt, one split)."""
    thresholds: np.ndarray  # the distinct winner probabilities, descending
    coverage: np.ndarray  # share of queries with winner probability ≥ the threshold
    precision: np.ndarray  # share of those whose winner is right
    n: int
    errors: int  # wrong winners when every query is answered


def curve(top_prob: np.ndarray, correct: np.ndarray) -> Curve:
    """`top_prob` [n]: each query's winner probability; `correct` [n]: whether its winner is the gold label."""
    p = np.asarray(top_prob, dtype=np.float64)
    ok = np.asarray(correct, dtype=bool)
    if p.shape != ok.shape or p.ndim != 1 or not len(p):
        raise ValueError(f"a threshold curve needs one probability and one correctness per query "
                         f"(got {p.shape} and {ok.shape})")
    order = np.argsort(-p, kind="stable")
    ps, oks = p[order], ok[order]
    hits = np.cumsum(oks)
    # the last position of each distinct probability: a threshold answers every query tied with it
    last = np.flatnonzero(np.append(ps[1:] != ps[:-1], True))
    answered = last + 1
    return Curve(ps[last], answered / len(p), hits[last] / answered, len(p), int((~ok).sum()))


def answered(top_prob: np.ndarray, winners: list[str], t: Threshold) -> np.ndarray:
    """[n] bool: which queries a threshold answers (per-label thresholds included), as `apply` decides."""
    return np.array([p >= t.needed(w) for p, w in zip(top_prob, winners)], dtype=bool)


def summary(answered_: np.ndarray, correct: np.ndarray) -> dict[str, Any]:
    """Coverage, precision of the answered and the share of the errors avoided (wrong winners not given)."""
    a, ok = np.asarray(answered_, dtype=bool), np.asarray(correct, dtype=bool)
    errors = int((~ok).sum())
    n_ans = int(a.sum())
    wrong = int((a & ~ok).sum())
    return {"n": int(len(a)), "answered": n_ans, "coverage": n_ans / len(a) if len(a) else None,
            "precision": (n_ans - wrong) / n_ans if n_ans else None,
            "errors_avoided": (errors - wrong) / errors if errors else None}


def fit_precision(top_prob: np.ndarray, correct: np.ndarray, target: float,
                  confidence: float | None = CONFIDENCE) -> dict[str, Any]:
    """The lowest threshold whose answered set's precision is certified ≥ `target` at `confidence` (module
    docstring). Returns {reached, threshold (None when not reached), precision, coverage, answered, n,
    lower_bound, confidence, best_precision, best_coverage, best_lower_bound, more_needed}."""
    from qcls.heads.bounds import clopper_pearson_lower, more_needed
    if not 0.0 < target <= 1.0:
        raise ValueError(f"target precision {target}: give a share in (0, 1], e.g. 0.95")
    if confidence is not None and not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence {confidence}: give a level in (0, 1), e.g. 0.9")
    c = curve(top_prob, correct)
    answered_ = np.rint(c.coverage * c.n).astype(int)
    hits = np.rint(c.precision * answered_).astype(int)
    if confidence is None:
        judged = c.precision
    else:
        judged = np.array([clopper_pearson_lower(int(k), int(m), confidence) for k, m in zip(hits, answered_)])
    ok = np.flatnonzero(judged >= target)
    best = len(judged) - 1 - int(np.argmax(judged[::-1]))  # the best bound (or precision), at its largest coverage
    out: dict[str, Any] = {"target_precision": float(target), "confidence": confidence, "n": c.n,
                           "best_precision": float(c.precision[best]), "best_coverage": float(c.coverage[best])}
    if confidence is not None:
        out["best_lower_bound"] = float(judged[best])
    if not len(ok):
        if confidence is not None:  # the fewest further labelled queries any candidate would need
            needs = [more_needed(int(k), int(m), target, confidence) for k, m in zip(hits, answered_)]
            needs = [int(np.ceil(x / cov)) for x, cov in zip(needs, c.coverage) if x is not None]
            out["more_needed"] = min(needs) if needs else None
        return {**out, "reached": False, "threshold": None, "precision": None, "coverage": None,
                "answered": None, "lower_bound": None}
    k = ok[-1]
    t = 0.0 if k == len(c.thresholds) - 1 else float(c.thresholds[k])
    got = {"reached": True, "threshold": t, "precision": float(c.precision[k]), "coverage": float(c.coverage[k]),
           "answered": int(answered_[k])}
    if confidence is not None:
        got["lower_bound"] = float(judged[k])
    return {**out, **got}


def fit_coverage(top_prob: np.ndarray, correct: np.ndarray, target: float) -> dict[str, Any]:
    """The highest threshold that answers at least `target` of the queries."""
    if not 0.0 < target <= 1.0:
        raise ValueError(f"target coverage {target}: give a share in (0, 1], e.g. 0.8")
    c = curve(top_prob, correct)
    k = int(np.flatnonzero(c.coverage >= target - 1e-12)[0])
    return {"target_coverage": float(target), "n": c.n, "reached": True, "threshold": float(c.thresholds[k]),
            "precision": float(c.precision[k]), "coverage": float(c.coverage[k])}


def parse_targets(values: list[str] | None, prompts: list[str], flag: str) -> dict[str, float]:
    """`--target-precision 0.95` (every prompt) and/or `--target-precision category=0.9` (one prompt; wins
    over the plain value) → per prompt its target."""
    default, per = None, {}
    for v in values or []:
        for part in v.split(","):
            name, sep, num = part.rpartition("=")
            try:
                x = float(num)
            except ValueError:
                raise ValueError(f"{flag} {part!r}: give a share such as 0.95, or PROMPT=0.95") from None
            if not 0.0 < x <= 1.0:
                raise ValueError(f"{flag} {part!r}: the target is a share in (0, 1]")
            if not sep:
                default = x
            elif name not in prompts:
                raise ValueError(f"{flag} {part!r}: no prompt {name!r} (prompts: {', '.join(prompts)})")
            else:
                per[name] = x
    return {p: per.get(p, default) for p in prompts if per.get(p, default) is not None}
