"""The tail (design.md §4): read hidden states × label rows of the LM head → every label's score.

For one batch size, every prompt's ScorePlan is stacked into flat tables once at start-up, so the tail is
a fixed handful of kernels (capturable in the same CUDA graph as the forward):

    logits  = h_read @ rows.T                  [R, K]   (K = distinct label tokens of all prompts)
    x       = logits[entry_read, entry_col]    [E]
    x      -= normaliser (sibling-group LSE | full-vocabulary LSE | 0)
    scores  = table @ [x, 1]                   [2 × labels of all prompts × b]: raw, then calibrated

`table` = [[W, 0], [W / T, b / T]] per label row (design.md §9): calibration is one more block of the same
product, built at start-up, so it adds no kernel. Without a calibration the second block is the identity
(T = 1, b = 0): the kernel sequence, the tensor shapes and the number of CUDA graphs do not depend on it.
"""
from __future__ import annotations

import torch

from qcls.scoring.strategies import ScorePlan


class Tail:
    def __init__(self, plans: list[ScorePlan], b: int, head_rows: torch.Tensor, head_tokens: list[int],
                 full_head: torch.Tensor | None, vocab_chunk: int, device: torch.device,
                 affine: list[tuple[float, list[float]]] | None = None):
        """`affine`: per prompt (temperature, per-label bias) of the calibration; None = the identity."""
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
        self.label_counts = [p.weights.shape[0] for p in plans]
        self.table = self._table(torch.block_diag(*blocks), b, affine).to(device)  # [2 × labels × b, E + 1]
        self.n_e = n_e
        # x lives in a static buffer whose last entry is a constant 1 (the bias column's input); each path's
        # last op writes x straight into it (out=), so the product reads it with no extra copy.
        self.x1 = torch.zeros(n_e + 1, dtype=torch.float32, device=device)
        self.x1[n_e] = 1.0
        self.e_flat = self.e_read * self.rows.shape[0] + self.e_col  # into logits.view(-1)

    def _table(self, weights: torch.Tensor, b: int, affine) -> torch.Tensor:
        affine = affine or [(1.0, [0.0] * n) for n in self.label_counts]
        if [len(bias) for _, bias in affine] != self.label_counts:
            raise ValueError(f"calibration tables cover {[len(x) for _, x in affine]} labels per prompt, "
                             f"the prompts have {self.label_counts}")
        inv_t = torch.tensor([1.0 / t for t, bias in affine for _ in bias] * b, dtype=torch.float64)
        bias = torch.tensor([x for _, bias in affine for x in bias] * b, dtype=torch.float64)
        n, e = weights.shape
        table = torch.zeros(2 * n, e + 1, dtype=torch.float64)
        table[:n, :e] = weights
        table[n:, :e] = weights.double() * inv_t[:, None]
        table[n:, e] = bias * inv_t
        return table.float()

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
        """[2 × labels × b] scores: every prompt's raw scores for each query, then the calibrated ones."""
        logits = h_read.float() @ self.rows.T
        out = self.x1[:self.n_e]
        if self.normaliser == "none":
            torch.index_select(logits.view(-1), 0, self.e_flat, out=out)
        else:
            x = logits[self.e_read, self.e_col]
            if self.normaliser == "group":
                ext = torch.cat([x, x.new_full((1,), float("-inf"))])
                lse = torch.logsumexp(ext[self.gidx], -1)
                torch.sub(x, torch.cat([lse, lse.new_zeros(1)])[self.e_group], out=out)
            else:
                torch.sub(x, self.vocab_lse(h_read)[self.e_read], out=out)
        return self.table @ self.x1
