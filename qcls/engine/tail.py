"""The tail (docs/design.md §4, §10): read hidden states × label rows of the LM head → every label's score, and
the prompts' heads on top.

For one batch size, every prompt's ScorePlan and head are stacked into flat tables once at start-up, so the
tail is a fixed handful of kernels (capturable in the same CUDA graph as the forward):

    logits  = h_read @ rows.T                  [R, K]   (K = distinct label tokens of all prompts)
    x       = logits[entry_read, entry_col]    [E]
    x      -= normaliser (sibling-group LSE | full-vocabulary LSE | 0)
    out     = table @ [x, 1]                   [2 × labels of all prompts × b]: raw, then head logits
    out[n:] += W_f · read states               (only when a head reads hidden states)

With the sibling-group normaliser on a GPU (engine.fuse_tail), the gather, the group log-sum-exps and the
subtraction are one Triton kernel (as torch ops: eight small launches, ~15 µs of a batch-1 forward on an
H100): each entry reads its group's logits itself (`members`, built here).

`table` = [[W, 0], [W_s · W, c]] per (query, prompt) (docs/design.md §9–10): a head's score weights and bias are
one more block of the same product, built at start-up. Without a head that block is the identity
(W_s = I, c = 0), so a temperature/bias calibration adds no kernel. A head that reads hidden states adds one
gather and one batched product over the taps the forward recorded (engine/taps.py).
"""
from __future__ import annotations

import numpy as np
import torch

from qcls.engine.kernels import triton, use_triton
from qcls.heads.head import PromptHead, Tap
from qcls.scoring.strategies import ScorePlan

if triton is not None:
    import triton.language as tl

    @triton.jit
    def _group_scores_kernel(logits_ptr, flat_ptr, members_ptr, out_ptr, E, W: tl.constexpr, BE: tl.constexpr,
                             BW: tl.constexpr):
        """out[e] = logits[flat[e]] - logsumexp(logits[members[e, :]]) (members -1: none; an entry with no
        group subtracts 0), float32, the max-shifted form torch.logsumexp computes."""
        e = tl.program_id(0) * BE + tl.arange(0, BE)
        ok = e < E
        x = tl.load(logits_ptr + tl.load(flat_ptr + e, mask=ok, other=0), mask=ok, other=0.0)
        w = tl.arange(0, BW)[None, :]
        mem = tl.load(members_ptr + e[:, None] * W + w, mask=ok[:, None] & (w < W), other=-1)
        valid = mem >= 0
        v = tl.load(logits_ptr + tl.where(valid, mem, 0), mask=valid, other=float("-inf"))
        m = tl.max(v, 1)
        alone = m == float("-inf")
        m_safe = tl.where(alone, 0.0, m)
        lse = m_safe + tl.log(tl.sum(tl.exp(v - m_safe[:, None]), 1))
        tl.store(out_ptr + e, x - tl.where(alone, 0.0, lse), mask=ok)


class Tail:
    def __init__(self, plans: list[ScorePlan], b: int, head_rows: torch.Tensor, head_tokens: list[int],
                 full_head: torch.Tensor | None, vocab_chunk: int, device: torch.device,
                 heads: list[PromptHead | None] | None = None, taps: list[Tap] = (), hidden: int = 0,
                 fused: bool = True):
        """`heads`: per prompt its head or None (raw scores); `taps`: the order of the forward's tap buffer;
        `fused`: engine.fuse_tail (the group normaliser in one kernel where Triton runs on the device)."""
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
        # tiny table: keep the label logits exact. None: no label is scored (the forward stops at a head's layer)
        self.rows = None if head_rows is None else head_rows.to(device=device, dtype=torch.float32)
        self.full_head = full_head
        self.vocab_chunk = vocab_chunk
        self.e_read = torch.tensor(e_read, dtype=torch.long, device=device)
        self.e_col = torch.tensor(e_col, dtype=torch.long, device=device)
        self.e_group = torch.tensor([g if g >= 0 else n_g for g in e_group], dtype=torch.long, device=device)
        self.gidx = gidx.to(device)
        self.label_counts = [p.weights.shape[0] for p in plans]
        heads = list(heads) if heads is not None else [None] * len(plans)
        if len(heads) != len(plans) or any(h is not None and len(h.labels) != n
                                           for h, n in zip(heads, self.label_counts)):
            raise ValueError(f"heads cover {[None if h is None else len(h.labels) for h in heads]} labels per "
                             f"prompt, the prompts have {self.label_counts}")
        self.table = self._table(plans, b, heads).to(device)  # [2 × labels × b, E + 1]
        self.n_e = n_e
        self.n = sum(self.label_counts) * b
        # x lives in a static buffer whose last entry is a constant 1 (the bias column's input); each path's
        # last op writes x straight into it (out=), so the product reads it with no extra copy.
        self.x1 = torch.zeros(n_e + 1, dtype=torch.float32, device=device)
        self.x1[n_e] = 1.0
        self.e_flat = self.e_read * (0 if self.rows is None else self.rows.shape[0]) + self.e_col  # logits.view(-1)
        if n_e and self.rows is None:
            raise ValueError("the prompts' plans score label tokens, but no LM-head rows were given")
        self.n_g = n_g
        self.members = self.group_members() if fused and normaliser == "group" and use_triton(self.e_flat) else None
        self.features = _FeatureProduct(heads, list(taps), b, hidden, self.label_counts, device) \
            if any(h is not None and h.read is not None for h in heads) else None

    def _table(self, plans: list[ScorePlan], b: int, heads: list[PromptHead | None]) -> torch.Tensor:
        raw, head_w, head_c = [], [], []
        for plan, h in zip(plans, heads):
            w = plan.weights.double()
            raw.append(w)
            if h is None:  # identity: the head block repeats the raw scores
                head_w.append(w)
                head_c.append(torch.zeros(w.shape[0], dtype=torch.float64))
                continue
            sw = torch.zeros(w.shape[0], w.shape[0], dtype=torch.float64) if h.score_weights is None \
                else torch.from_numpy(h.score_weights)
            head_w.append(sw @ w)
            head_c.append(torch.from_numpy(h.bias))
        top = torch.block_diag(*raw * b)
        low = torch.block_diag(*head_w * b)
        n, e = top.shape
        table = torch.zeros(2 * n, e + 1, dtype=torch.float64)
        table[:n, :e] = top
        table[n:, :e] = low
        table[n:, e] = torch.cat(head_c * b)
        return table.float()

    def group_members(self) -> torch.Tensor:
        """[E, width] per entry its sibling group's entries as indices into logits.view(-1), -1 padding (an
        entry without a group: all -1): the fused kernel's table."""
        flat = torch.cat([self.e_flat, self.e_flat.new_full((1,), -1)])  # gidx's padding (n_e) → -1
        rows = torch.cat([flat[self.gidx][:self.n_g], flat.new_full((1, self.gidx.shape[1]), -1)])  # row n_g: none
        return rows[self.e_group].contiguous()

    def vocab_lse(self, h: torch.Tensor) -> torch.Tensor:
        """log-sum-exp over the full vocabulary at each read row; never a [rows, vocab] fp32 tensor held
        longer than one chunk."""
        # fp32 products: fp16 logits of magnitude ~30 are rounded by ~0.015, which the normaliser would
        # carry straight into the score. One chunk of the head is converted at a time.
        h = h.float()
        parts = [torch.logsumexp(h @ self.full_head[i:i + self.vocab_chunk].float().T, -1)
                 for i in range(0, self.full_head.shape[0], self.vocab_chunk)]
        return torch.logsumexp(torch.stack(parts, -1), -1)

    def __call__(self, h_read: torch.Tensor, taps: torch.Tensor | None = None) -> torch.Tensor:
        """[2 × labels × b] scores: every prompt's raw scores for each query, then the head logits. `taps` is
        the forward's tap buffer when a head reads hidden states. With no label token to score (the forward
        stopped at a head's layer: `h_read` is None) the raw block is 0 and only the heads' block is computed."""
        if self.n_e == 0:
            scores = self.table @ self.x1
            if self.features is not None:
                scores[self.n:] += self.features(taps)
            return scores
        logits = h_read.float() @ self.rows.T
        out = self.x1[:self.n_e]
        if self.normaliser == "none":
            torch.index_select(logits.view(-1), 0, self.e_flat, out=out)
        elif self.members is not None:
            width = self.members.shape[1]
            _group_scores_kernel[(triton.cdiv(self.n_e, 128),)](logits, self.e_flat, self.members, out, self.n_e,
                                                                 W=width, BE=128, BW=triton.next_power_of_2(width))
        else:
            x = logits[self.e_read, self.e_col]
            if self.normaliser == "group":
                ext = torch.cat([x, x.new_full((1,), float("-inf"))])
                lse = torch.logsumexp(ext[self.gidx], -1)
                torch.sub(x, torch.cat([lse, lse.new_zeros(1)])[self.e_group], out=out)
            else:
                torch.sub(x, self.vocab_lse(h_read)[self.e_read], out=out)
        scores = self.table @ self.x1
        if self.features is not None:
            scores[self.n:] += self.features(taps)
        return scores


class _FeatureProduct:
    """W_f · read state for every (query, prompt) as one gather and one batched product over prompts:

        feats  [P, S, b, k] = taps[tap(p, j), row(q, p)] cut in slices of k   (J·H = S·k; J = most taps a
                                                                              prompt reads; missing → zeros)
        logits [P, Lmax, b] = Σ_s W [P, s, Lmax, k] @ feats[:, s]^T
        out    [labels × b] = logits in the tail's flat (query, prompt, label) order
    """

    def __init__(self, heads: list[PromptHead | None], taps: list[Tap], b: int, hidden: int,
                 label_counts: list[int], device: torch.device):
        n_p, lmax = len(heads), max(label_counts)
        parts = [[taps.index(t) for t in h.read.taps] if h is not None and h.read is not None else [] for h in heads]
        j = max(len(x) for x in parts)
        rows = b * n_p + 2  # the tap buffer's rows per tap (engine/taps.py): rows, then two of zeros
        zero = rows - 1
        idx = np.full((n_p, b, j), zero, dtype=np.int64)
        w = np.zeros((n_p, lmax, j * hidden), dtype=np.float32)
        for p, (h, ps) in enumerate(zip(heads, parts)):
            for q in range(b):
                idx[p, q, :len(ps)] = [t * rows + q * n_p + p for t in ps]
            if ps:
                if h.feature_weights.shape[1] != len(ps) * hidden:
                    raise ValueError(f"a head reads {len(ps)} tap(s) of {hidden}, its weights have "
                                     f"{h.feature_weights.shape[1]} columns")
                w[p, :len(h.labels), :len(ps) * hidden] = h.feature_weights
        sel = [p * lmax * b + lab * b + q for q in range(b) for p in range(n_p) for lab in range(label_counts[p])]
        # Split-K: a product of [Lmax, J·H] by [J·H, b] per prompt is a long, thin reduction that one thread
        # block would walk alone (the suspect of a head's +0.15 ms tail at b=4 on an H100, J·H=5120). Each state is read as d chunks of k = H/d values,
        # so the gather already yields the S = J·d slices as [P·S, b, k], and the S·P partial products are
        # summed after one batched product.
        d = max((n for n in range(1, 17) if hidden % n == 0 and hidden // n >= 128), default=1)
        k, n_s = hidden // d, j * d
        chunk = (idx[:, :, :, None] * d + np.arange(d)).transpose(0, 2, 3, 1)  # [P, J, d, b]
        self.k = k
        self.idx = torch.from_numpy(chunk.reshape(-1)).to(device)
        self.w = torch.from_numpy(w.reshape(n_p, lmax, n_s, k).transpose(0, 2, 1, 3).reshape(n_p * n_s, lmax, k)
                                  .copy()).to(device)
        self.feat_shape = (n_p * n_s, b, k)
        self.out_shape = (n_p, n_s, lmax, b)
        self.sel = torch.tensor(sel, dtype=torch.long, device=device)

    def __call__(self, taps: torch.Tensor) -> torch.Tensor:
        feats = taps.view(-1, self.k).index_select(0, self.idx).view(self.feat_shape)  # [P·S, b, k]
        part = torch.bmm(self.w, feats.transpose(1, 2)).view(self.out_shape)  # [P, S, Lmax, b]
        return part.sum(1).view(-1).index_select(0, self.sel)
