"""Which queries to label next (`qcls label-next`): from a pool of unlabelled queries, the N whose gold labels
should teach the head the most, most useful first. Pure numpy on what the model gave for each candidate:
every label's probability per prompt and the state the head reads.

The rule, in order:

1. **Uncertainty.** Per prompt the margin p1 − p2 between its two most probable labels (small: the head cannot
   tell them apart); a query's margin is the smallest over the prompts (or that of the one prompt targeted).
   The probabilities are the head's where the head file has one for the prompt; a prompt without a head yet
   (a cold start, or too few labels to fit one) is ranked by its LLM label scores' softmax, what qcls answers
   with for it. `by_frequency` ranks by (1 − margin) · log(1 + count): a query asked often counts more.
2. **Diversity.** Candidates are taken in that order, skipping one whose state has a cosine similarity ≥
   `similarity` with a query already picked in this batch (two near-identical queries teach what one does).
   States are standardised per feature over the pool and the labelled queries, so the cosine compares how
   queries differ rather than the few huge dimensions every residual stream shares.
3. **Coverage.** A share of the batch (`coverage`) is kept for queries far from everything labelled: farthest-
   first over the states, each time the candidate whose nearest labelled or picked query is the least similar
   (weighted by log(1 + count) with `by_frequency`). The head can be confident and wrong on kinds of query the
   labels never covered; uncertainty alone never picks those.

The two kinds are interleaved evenly in the output. Exact and normalised duplicates (case and whitespace) and
already-labelled queries are gone before this point (qcls/bulk/pool.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

STD_FLOOR = 1e-6  # a feature constant over the rows carries no direction; it must not divide by zero
# On the default demo "red dress" and "red dresses" are at 0.84, two dev queries at 0.59 (median nearest) and the
# most alike pair of the dev split ("beige trench coat women", "womens trench coat grey") at 0.92.
SIMILARITY = 0.8
COVERAGE = 0.3


@dataclass
class Candidates:
    """The pool as the model saw it, rows in pool order."""
    queries: list[str]
    counts: np.ndarray  # [n] times each was asked
    probs: dict[str, np.ndarray]  # prompt → [n, labels] the probabilities the rule ranks by
    labels: dict[str, list[str]]  # prompt → its labels, in the columns' order
    served_by: dict[str, str]  # prompt → "head" or "LLM label scores"
    states: np.ndarray  # [n, D] unit vectors (unit_states)


@dataclass
class Pick:
    index: int  # row of the candidate
    kind: str  # "uncertainty" or "coverage"
    why: str
    margins: dict[str, float] = field(default_factory=dict)


def margins(probs: np.ndarray) -> np.ndarray:
    """[n] p1 − p2 of each row's two most probable labels (1 for a prompt of one label)."""
    if probs.shape[1] < 2:
        return np.ones(len(probs))
    top = np.sort(probs, axis=1)[:, -2:]
    return top[:, 1] - top[:, 0]


def unit_states(blocks: list[np.ndarray]) -> np.ndarray:
    """[n, D]: each prompt's state block [n, F] standardised per feature over the n rows and scaled to unit
    length, concatenated and divided by √prompts, so a row is a unit vector and the cosine of two rows is the
    mean of their per-prompt cosines."""
    parts = []
    for x in blocks:
        x = np.asarray(x, dtype=np.float64)
        z = (x - x.mean(0)) / np.maximum(x.std(0), STD_FLOOR)
        norm = np.linalg.norm(z, axis=1, keepdims=True)
        parts.append(np.divide(z, norm, out=np.zeros_like(z), where=norm > 0))
    return np.concatenate(parts, axis=1) / np.sqrt(len(parts))


def choose(c: Candidates, n: int, labelled: np.ndarray | None = None, *, prompt: str | None = None,
           similarity: float = SIMILARITY, coverage: float = COVERAGE, by_frequency: bool = False) -> list[Pick]:
    """The n picks, most useful first. `labelled`: [m, D] states of the queries already labelled (unit_states
    over the same rows as c.states), or None. `prompt`: rank by that prompt's margin alone."""
    if not 1 <= n <= len(c.queries):
        raise ValueError(f"n={n}: the pool has {len(c.queries)} candidates")
    names = [prompt] if prompt else list(c.probs)
    m = np.stack([margins(c.probs[p]) for p in names], axis=1)  # [n, prompts]
    worst = m.argmin(1)
    weight = np.log1p(c.counts) if by_frequency else np.ones(len(c.queries))
    score = (1.0 - m.min(1)) * weight
    order = sorted(range(len(score)), key=lambda i: (-score[i], -c.counts[i], i))
    n_cov = int(round(coverage * n))
    picked: list[int] = []
    unc = _diverse(order, c.states, picked, n - n_cov, similarity)
    cov = _farthest(c.states, labelled, picked, n_cov, similarity, weight)
    if len(picked) < n:  # too few distinct states left: the rest in order of uncertainty, near-duplicates or not
        unc += [i for i in order if i not in picked][:n - len(picked)]
    picks = []
    for k, i in enumerate(unc):
        p = names[worst[i]]
        why = f"margin {m[i, worst[i]]:.3f} on {p}" + (f", asked {int(c.counts[i])}×" if by_frequency else "")
        picks.append(((k + 0.5) / len(unc), Pick(i, "uncertainty", why, _margins(c, i))))
    for k, (i, sim) in enumerate(cov):
        why = "coverage: nearest the pool's centre" if sim < -1 else f"coverage: similarity {sim:.2f} to the nearest"
        picks.append(((k + 0.5) / len(cov), Pick(i, "coverage", why, _margins(c, i))))
    return [p for _, p in sorted(picks, key=lambda kp: kp[0])]


def _margins(c: Candidates, i: int) -> dict[str, float]:
    return {p: round(float(margins(v[i:i + 1])[0]), 4) for p, v in c.probs.items()}


def _diverse(order: list[int], states: np.ndarray, picked: list[int], k: int, similarity: float) -> list[int]:
    """Up to k of `order`, in order, none with similarity ≥ `similarity` to one picked before; appended to
    `picked`."""
    out: list[int] = []
    for i in order:
        if len(out) >= k:
            break
        if picked and float(np.max(states[picked] @ states[i])) >= similarity:
            continue
        out.append(i)
        picked.append(i)
    return out


def _farthest(states: np.ndarray, labelled: np.ndarray | None, picked: list[int], k: int, similarity: float,
              weight: np.ndarray) -> list[tuple[int, float]]:
    """Farthest-first: k times the candidate (not picked) whose nearest labelled or picked state is the least
    similar, times its weight; with nothing labelled or picked, first the candidate nearest the pool's mean.
    (index, similarity to its nearest) pairs, appended to `picked`."""
    out: list[tuple[int, float]] = []
    if k <= 0:
        return out
    ref = [labelled] if labelled is not None and len(labelled) else []
    nearest = np.full(len(states), -2.0)  # below any cosine: nothing to be near yet
    for r in ref + ([states[picked]] if picked else []):
        nearest = np.maximum(nearest, (states @ r.T).max(1))
    free = np.ones(len(states), dtype=bool)
    free[picked] = False
    while len(out) < k and free.any():
        if not ref and not picked:
            gain = np.where(free, states @ states.mean(0), -np.inf)
        else:
            gain = np.where(free & (nearest < similarity), (1.0 - nearest) * weight, -np.inf)
        i = int(np.argmax(gain))
        if not np.isfinite(gain[i]):
            break  # every candidate left is a near-duplicate of one labelled or picked
        out.append((i, float(nearest[i])))
        picked.append(i)
        free[i] = False
        nearest = np.maximum(nearest, states @ states[i])
    return out
