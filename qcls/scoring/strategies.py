"""Scoring strategies (docs/design.md §3) as tensor plans.

A strategy makes a `ScorePlan` of a prompt's trie: which trie nodes need a hidden state (`read_nodes`,
root first), the (node, token) *entries* whose logits are read, how entries are normalised, and a matrix
`weights` [labels, entries] so that

    scores = weights @ (logit[entry] - normaliser[entry])

The normaliser is 0 (first_token), the log-sum-exp over the entry's sibling group (trie), or the
full-vocabulary log-sum-exp at the entry's node (exact, mean_logprob). Adding a strategy = one class
here + one line in STRATEGIES.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from qcls.scoring.trie import LabelTrie


@dataclass
class ScorePlan:
    read_nodes: list[int]  # trie nodes whose final hidden state is read; read_nodes[0] == 0 (root)
    entry_read: list[int]  # per entry: index into read_nodes
    entry_token: list[int]  # per entry: vocabulary id whose logit is read
    entry_group: list[int]  # per entry: sibling group (trie) or -1
    weights: torch.Tensor  # [labels, entries] float32
    normaliser: str  # "none" | "group" | "vocab"

    @property
    def n_groups(self) -> int:
        return max(self.entry_group, default=-1) + 1


def _plan(trie: LabelTrie, read_nodes: list[int], entries: list[tuple[int, int]], groups: list[int],
          label_entries: list[list[tuple[int, float]]], normaliser: str) -> ScorePlan:
    pos = {n: i for i, n in enumerate(read_nodes)}
    w = torch.zeros(len(label_entries), len(entries), dtype=torch.float32)
    for li, items in enumerate(label_entries):
        for e, v in items:
            w[li, e] += v
    return ScorePlan(read_nodes, [pos[n] for n, _ in entries], [t for _, t in entries], groups, w, normaliser)


def unscored(trie: LabelTrie) -> ScorePlan:
    """No label scored: only the row's root is read, for the heads (the forward stops at a head's layer)."""
    return _plan(trie, [0], [], [], [[] for _ in trie.label_paths], "none")


class FirstToken:
    name = "first_token"

    def plan(self, trie: LabelTrie) -> ScorePlan:
        entries, label_entries = [], []
        for li in range(len(trie.label_paths)):
            first = trie.nodes[trie.label_paths[li][0]].token
            label_entries.append([(len(entries), 1.0)])
            entries.append((0, first))
        return _plan(trie, [0], entries, [-1] * len(entries), label_entries, "none")


class Trie:
    """Label-constrained probability: log-softmax over the children at every branching node."""
    name = "trie"

    def plan(self, trie: LabelTrie) -> ScorePlan:
        read = [i for i in range(len(trie.nodes)) if i == 0 or trie.is_branching(i)]
        entries, groups, index = [], [], {}
        for g, node in enumerate(n for n in read if trie.is_branching(n)):
            for t in trie.child_tokens(node):
                index[(node, t)] = len(entries)
                entries.append((node, t))
                groups.append(g)
        label_entries = [[(index[s], 1.0) for s in trie.label_steps(li, with_end=True) if s in index]
                         for li in range(len(trie.label_paths))]
        return _plan(trie, read, entries, groups, label_entries, "group")


class Exact:
    """Sum of full-vocabulary log-probs of the label's tokens."""
    name = "exact"
    length_normalised = False

    def plan(self, trie: LabelTrie) -> ScorePlan:
        read = [i for i in range(len(trie.nodes)) if i == 0 or trie.nodes[i].children]
        entries, index, label_entries = [], {}, []
        for li in range(len(trie.label_paths)):
            steps = trie.label_steps(li, with_end=False)
            for s in steps:
                if s not in index:
                    index[s] = len(entries)
                    entries.append(s)
            scale = 1.0 / len(steps) if self.length_normalised else 1.0
            label_entries.append([(index[s], scale) for s in steps])
        return _plan(trie, read, entries, [-1] * len(entries), label_entries, "vocab")


class MeanLogprob(Exact):
    name = "mean_logprob"
    length_normalised = True


STRATEGIES = {s.name: s for s in (FirstToken, Trie, Exact, MeanLogprob)}


def get_strategy(name: str):
    try:
        return STRATEGIES[name]()
    except KeyError:
        raise ValueError(f"unknown scoring strategy {name!r}; known: {sorted(STRATEGIES)}") from None


def apply_plan(plan: ScorePlan, entry_logits: torch.Tensor, read_lse: torch.Tensor | None = None) -> torch.Tensor:
    """Scores [..., labels] from entry logits [..., entries] (and, for `vocab`, the full-vocabulary
    log-sum-exp at each read node [..., reads]). Written for one prompt; the engine uses the batched twin."""
    x = entry_logits.float()
    if plan.normaliser == "group":
        g = torch.tensor(plan.entry_group)
        norm = torch.empty_like(x)
        for gi in range(plan.n_groups):
            sel = g == gi
            norm[..., sel] = torch.logsumexp(x[..., sel], -1, keepdim=True)
        x = x - norm
    elif plan.normaliser == "vocab":
        x = x - read_lse.float()[..., plan.entry_read]
    return x @ plan.weights.T
