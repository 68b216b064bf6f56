"""The tail (design.md §4): read hidden states × label rows of the LM head → every label's score.

For one batch size, every prompt's ScorePlan is stacked into flat tables once at start-up, so the tail is
a fixed handful of kernels (capturable in the same CUDA graph as the forward):

    logits  = h_read @ rows.T                  [R, K]   (K = distinct label tokens of all prompts)
    x       = logits[entry_read, entry_col]    [E]
    x      -= normaliser (sibling-group LSE | full-vocabulary LSE | 0)
    scores  = weights @ x                      [labels of all prompts × b]
"""
from __future__ import annotations

import torch

from qcls.scoring.strategies import ScorePlan


class Tail:
    def __init__(self, plans: list[ScorePlan], b: int, head_rows: torch.Tensor, head_tokens: list[int],
                 full_head: torch.Tensor | None, vocab_chunk: int, device: torch.device):
        col = {t: i for i, t in enumerate(head_tokens)}
        normaliser = plans[0].normaliser
        if normaliser == "vocab" and full_head is None:
            raise ValueError("this strategy needs the full LM head for its normaliser, which the backend dropped")
        e_read, e_col, e_group, groups, blocks = [], [], [], [], []
        read_off = 0
        for _ in range(b):
            for plan in plans:
                base_e, base_g = len(e_read), len(groups)
                e_read += [read_off + r for r in plan.entry_read]
                e_col += [col[t] for t in plan.entry_token]
                for g in range(plan.n_groups):
                    groups.append([base_e + i for i, eg in enumerate(plan.entry_group) if eg == g])
                e_group += [base_g + g if g >= 0 else -1 for g in plan.entry_group]
                blocks.append(plan.weights)
                read_off += len(plan.read_nodes)
        n_e, n_g = len(e_read), len(groups)
        width = max((len(g) for g in groups), default=1)
        gidx = torch.full((max(n_g, 1), width), n_e, dtype=torch.long)  # n_e → the appended -inf
        for i, g in enumerate(groups):
            gidx[i, :len(g)] = torch.tensor(g)
        self.normaliser = normaliser
        self.n_reads = read_off
        self.rows = head_rows.to(device=device, dtype=torch.float32)  # tiny table: keep the label logits exact
        self.full_head = full_head
        self.vocab_chunk = vocab_chunk
        self.e_read = torch.tensor(e_read, dtype=torch.long, device=device)
        self.e_col = torch.tensor(e_col, dtype=torch.long, device=device)
        self.e_group = torch.tensor([g if g >= 0 else n_g for g in e_group], dtype=torch.long, device=device)
        self.gidx = gidx.to(device)
        self.weights = torch.block_diag(*blocks).to(device)  # [labels × b, E]
        self.label_counts = [p.weights.shape[0] for p in plans]

    def vocab_lse(self, h: torch.Tensor) -> torch.Tensor:
        """log-sum-exp over the full vocabulary at each read row; never a [rows, vocab] fp32 tensor held
        longer than one chunk."""
        # fp32 products: fp16 logits of magnitude ~30 are rounded by ~0.015, which the normaliser would
        # carry straight into the score. One chunk of the head is converted at a time.
        h = h.float()
        parts = [torch.logsumexp(h @ self.full_head[i:i + self.vocab_chunk].float().T, -1)
                 for i in range(0, self.full_head.shape[0], self.vocab_chunk)]
        return torch.logsumexp(torch.stack(parts, -1), -1)

    def __call__(self, h_read: torch.Tensor) -> torch.Tensor:
        logits = h_read.float() @ self.rows.T
        x = logits[self.e_read, self.e_col]
        if self.normaliser == "group":
            ext = torch.cat([x, x.new_full((1,), float("-inf"))])
            lse = torch.logsumexp(ext[self.gidx], -1)
            x = x - torch.cat([lse, lse.new_zeros(1)])[self.e_group]
        elif self.normaliser == "vocab":
            x = x - self.vocab_lse(h_read)[self.e_read]
        return self.weights @ x
