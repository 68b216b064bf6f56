"""The label trie of one prompt (docs/design.md §2), rooted at "after the suffix".

Node 0 is the root. Nodes are created parent-first, so a node's index is larger than its ancestors'.
A label that is a strict token-prefix of another gets an *end child* (the end token) at its last node.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from qcls.errors import LabelSetError


@dataclass
class Node:
    token: int | None  # None for the root
    depth: int
    parent: int | None
    children: dict[int, int] = field(default_factory=dict)  # token -> node index
    label: int | None = None  # index of the label that ends here


@dataclass
class LabelTrie:
    nodes: list[Node]
    label_paths: list[list[int]]  # per label: node indices along its tokens (root excluded)
    end_id: int | None

    @classmethod
    def build(cls, label_ids: list[tuple[int, ...]] | tuple[tuple[int, ...], ...], end_id: int | None) -> "LabelTrie":
        nodes = [Node(None, 0, None)]
        paths = []
        for li, ids in enumerate(label_ids):
            if not ids:
                raise LabelSetError(f"label {li} has no tokens")
            cur, path = 0, []
            for t in ids:
                nxt = nodes[cur].children.get(t)
                if nxt is None:
                    nxt = len(nodes)
                    nodes.append(Node(t, nodes[cur].depth + 1, cur))
                    nodes[cur].children[t] = nxt
                cur = nxt
                path.append(cur)
            if nodes[cur].label is not None:
                raise LabelSetError(f"labels {nodes[cur].label} and {li} have the same tokens {list(ids)}")
            nodes[cur].label = li
            paths.append(path)
        trie = cls(nodes, paths, end_id)
        if end_id is not None and any(t == end_id for n in nodes for t in n.children):
            raise LabelSetError(f"the end token {end_id} appears inside a label; choose another label_end")
        if trie.needs_end() and end_id is None:
            raise LabelSetError("a label is a token-prefix of another, and the tokenizer has no eos token to end "
                             "it: set label_end on the prompt")
        return trie

    def needs_end(self) -> bool:
        return any(n.label is not None and n.children for n in self.nodes)

    def child_tokens(self, i: int) -> list[int]:
        """Tokens that can follow node i among the labels: its children, plus the end token if a label
        ends at i while others continue."""
        n = self.nodes[i]
        toks = list(n.children)
        if n.label is not None and n.children:
            toks.append(self.end_id)
        return toks

    def is_branching(self, i: int) -> bool:
        return len(self.child_tokens(i)) >= 2

    def label_steps(self, label: int, with_end: bool) -> list[tuple[int, int]]:
        """(node, next token) pairs along a label: the node whose output predicts the token. With
        `with_end`, a label that others extend also takes the step to its end token."""
        path = self.label_paths[label]
        steps, parent = [], 0
        for node in path:
            steps.append((parent, self.nodes[node].token))
            parent = node
        last = path[-1]
        if with_end and self.nodes[last].children:
            steps.append((last, self.end_id))
        return steps

    def ancestors_or_self(self, i: int) -> list[int]:
        """Non-root nodes from depth 1 down to i."""
        out = []
        while i:
            out.append(i)
            i = self.nodes[i].parent
        return out[::-1]

    def row_nodes(self, read_nodes: list[int]) -> list[int]:
        """Trie tokens that must sit in the packed row so every read node has a hidden state."""
        need = {a for r in read_nodes for a in self.ancestors_or_self(r)}
        return sorted(need)
