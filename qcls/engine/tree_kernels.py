"""Triton kernels of the tree attention (qcls/engine/attention.py launches them, tree_plan.py plans them).

- `prefix_kernel`: one program = one work item of the plan (a chunk of prefix keys in contiguous pool
  slots, and up to QB blocks of BQ query tokens of the prompts that see that chunk) × one KV head with all
  query heads of its group. For each query block it reads the chunk's K/V and writes the partial softmax
  state of every (token, query head) over the chunk: running max m, sum l and unnormalised output acc
  (fp32), under the chunk's index along the prompt's prefix. UNMASKED (sm_80+) loads the chunk's whole
  steps of BN keys without masks and masks only its last, partial step.
- `row_kernel` (row_kernel.py, with the steps here): one program = one tile (≤ TILE tokens of one row) × one KV
  head (or, HS > 1, one of HS parts of its group of query heads: more, smaller programs where the grid is small).
  It starts from the tile's prefix state, merging the partials of its prompt's chunks or, for short prefixes,
  walking the prefix itself (one launch instead of two), adds the row's own keys (causal / trie ancestry),
  normalises and writes the output.

FUSED (engine.fuse_qkv_attention): the kernels take the QKV GEMM's output as it is and do the q/k/v
kernel's work themselves (qkv_kernels.rope_values), one launch fewer per layer: each program (q-norms and) rotates
its own query vectors in registers, rounded to the model's dtype as the q/k/v kernel rounds them (no store, barrier
and read back on the program's critical path). The row's keys: with KEYS_REG (Tuning.row_keys_in_registers) the
row kernel rotates them step by step in registers too, and nothing goes through the query or KV buffers; without it
(where the registers do not hold them: d=256, sm_75) each row-kernel program writes its row's keys and values into
the KV buffer for its KV head first and reads them back after a barrier (programs of one row write the same values).

Scores are in log2 units: `scale` is the softmax scale × log2(e) (the caller folds it), so every exponential
is an exp2 (one MUFU instruction; exp is exp2 of a product) and the partial maxima m are log2 units too.

A sliding window (window > 0) hides a key unless pos(query) - pos(key) < window; a prefix slot's position
is its index in its prompt's prefix. The window's value is an argument and WINDOW (whether there is one)
a compile-time flag, so layers without one pay nothing for it. Loop bounds are kernel arguments or
descriptor values: one compiled kernel serves every bucket. The dots are small (≤ BQ·group query vectors
× BN keys); on sm_75 Triton runs them without tensor cores.
"""
from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs
    triton = None

from qcls.engine.qkv_kernels import rope_apply, rope_inputs, rope_values  # noqa: E402,F401  (None without Triton)

WORK_FIELDS = 7  # first slot, keys, position of the first key, split index, prompt range lo/hi, first query block
RUN_FIELDS = 3  # a prefix run of contiguous pool slots: first slot, keys, position of the first key
TILE = 16  # row kernel: tokens per program (tile entries are written by layout.Packer)
TILES = (TILE, 2 * TILE)  # the tile sizes a bucket's plan may pick (tree_plan.Tuning.row_tile, wide_tile)
TILE_FIELDS = 5  # a tile entry (layout.Packer writes them): token start, token count, row start, row length, prompt


if triton is not None:
    _WORK = tl.constexpr(WORK_FIELDS)
    _RUN = tl.constexpr(RUN_FIELDS)
    _FAR = tl.constexpr(1 << 40)  # "no token here" in the minimum position of a block

    @triton.jit
    def _online(sc, m_i, l_i, acc, v):
        """One online-softmax step (scores sc [M, BN] in log2 units, -inf where hidden; v [BN, D])."""
        m_new = tl.maximum(m_i, tl.max(sc, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw nothing yet stay at 0
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(sc - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        return m_new, l_i, acc

    @triton.jit
    def _merge(m_i, l_i, acc, m_s, l_s, acc_s):
        """Fold a partial state (m_s, l_s, acc_s) into the running one."""
        m_new = tl.maximum(m_i, m_s)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        a = tl.exp2(m_i - m_safe)
        b = tl.exp2(m_s - m_safe)
        return m_new, l_i * a + l_s * b, acc * a[:, None] + acc_s * b[:, None]

    @triton.jit
    def _first_key(qpos, ok, kpos0, window, BN: tl.constexpr, WINDOW: tl.constexpr):
        """Start of the key loop: key blocks that every query of the block is a window past are skipped."""
        if WINDOW:
            return tl.maximum(tl.min(tl.where(ok, qpos.to(tl.int64), _FAR)) - window + 1 - kpos0, 0) // BN * BN
        else:
            return 0

    @triton.jit
    def _step_scores(q, kt, qpos, s, nkeys, kpos0, scale, window, BN: tl.constexpr, WINDOW: tl.constexpr):
        """Scores [M, BN] of keys s … s+BN-1 of a chunk of nkeys (kt: their keys, transposed), -inf where hidden."""
        j = s + tl.arange(0, BN)
        vis = (j < nkeys)[None, :]
        if WINDOW:
            vis = vis & (qpos[:, None] - (kpos0 + j)[None, :] < window)
        return tl.where(vis, tl.dot(q, kt) * scale, float("-inf"))

    @triton.jit
    def _chunk_keys(kh, slot0, s, nkeys, D: tl.constexpr, BN: tl.constexpr):
        """Keys s … s+BN-1 (transposed, [D, BN]) of a chunk of nkeys from pool slot slot0 on (0 past its end)."""
        j = s + tl.arange(0, BN)
        return tl.load(kh + (slot0 + j)[None, :] * D + tl.arange(0, D)[:, None], mask=(j < nkeys)[None, :], other=0.0)

    @triton.jit
    def _chunk_values(vh, slot0, s, nkeys, D: tl.constexpr, BN: tl.constexpr):
        """Values s … s+BN-1 [BN, D] of a chunk of nkeys from pool slot slot0 on (0 past its end)."""
        j = s + tl.arange(0, BN)
        return tl.load(vh + (slot0 + j)[:, None] * D + tl.arange(0, D)[None, :], mask=(j < nkeys)[:, None], other=0.0)

    @triton.jit
    def _chunk_kv(kh, vh, slot0, s, nkeys, D: tl.constexpr, BN: tl.constexpr):
        """Keys (transposed, [D, BN]) and values [BN, D] s … s+BN-1 of a chunk of nkeys from pool slot slot0 on."""
        return _chunk_keys(kh, slot0, s, nkeys, D, BN), _chunk_values(vh, slot0, s, nkeys, D, BN)

    @triton.jit
    def _chunk_step(q, kh, vh, qpos, m_i, l_i, acc, s, nkeys, kpos0, scale, window,
                    D: tl.constexpr, BN: tl.constexpr, WINDOW: tl.constexpr, slot0=0):
        """Keys s … s+BN-1 of a chunk of nkeys from pool slot slot0 on (masked: the step may pass its end); the
        values are loaded after the scores (_chunk_kv loads both at once)."""
        kt = _chunk_keys(kh, slot0, s, nkeys, D, BN)
        sc = _step_scores(q, kt, qpos, s, nkeys, kpos0, scale, window, BN, WINDOW)
        return _online(sc, m_i, l_i, acc, _chunk_values(vh, slot0, s, nkeys, D, BN))

    @triton.jit
    def prefix_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, qtok_ptr, qstart_ptr, work_ptr, part_ptr, ml_ptr,
                      qr_ptr, cos_ptr, sin_ptr, qw_ptr,
                      q_s0, q_s1, kv_s_head, part_s_split, qr_s0, n_heads, scale, window, eps,
                      G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BQ: tl.constexpr, BN: tl.constexpr,
                      QB: tl.constexpr, WINDOW: tl.constexpr, UNMASKED: tl.constexpr, FUSED: tl.constexpr,
                      HAS_NORM: tl.constexpr, OFFSET: tl.constexpr):
        w = tl.program_id(0)
        h = tl.program_id(1)  # KV head; its query heads are h·G … h·G+G-1
        wp = work_ptr + w * _WORK
        slot0 = tl.load(wp)
        nkeys = tl.load(wp + 1)
        kpos0 = tl.load(wp + 2)
        split = tl.load(wp + 3)
        t_lo = tl.load(qstart_ptr + tl.load(wp + 4))  # the query tokens of the prompts that see the chunk
        t_hi = tl.load(qstart_ptr + tl.load(wp + 5))
        blk0 = tl.load(wp + 6)
        kh = k_ptr + h * kv_s_head + slot0 * D
        vh = v_ptr + h * kv_s_head + slot0 * D
        if QB == 1:  # no branch around the key loop: a block past the request's tokens walks it masked (the
            # grid is the bucket's anyway), and the loop pipelines as the innermost loop of the program
            _prefix_block(q_ptr, pos_ptr, qtok_ptr, part_ptr, ml_ptr, kh, vh, t_lo + blk0 * BQ, t_hi, nkeys, kpos0,
                          split, q_s0, q_s1, part_s_split, n_heads, scale, window, h, qr_ptr, cos_ptr, sin_ptr, qw_ptr,
                          qr_s0, eps, G, GP, D, BQ, BN, WINDOW, UNMASKED, FUSED, HAS_NORM, OFFSET)
        else:
            for qb in range(QB):
                if t_lo + (blk0 + qb) * BQ < t_hi:
                    _prefix_block(q_ptr, pos_ptr, qtok_ptr, part_ptr, ml_ptr, kh, vh, t_lo + (blk0 + qb) * BQ, t_hi,
                                  nkeys, kpos0, split, q_s0, q_s1, part_s_split, n_heads, scale, window, h, qr_ptr,
                                  cos_ptr, sin_ptr, qw_ptr, qr_s0, eps, G, GP, D, BQ, BN, WINDOW, UNMASKED, FUSED,
                                  HAS_NORM, OFFSET)

    @triton.jit
    def _prefix_block(q_ptr, pos_ptr, qtok_ptr, part_ptr, ml_ptr, kh, vh, first, t_hi, nkeys, kpos0, split, q_s0,
                      q_s1, part_s_split, n_heads, scale, window, h, qr_ptr, cos_ptr, sin_ptr, qw_ptr, qr_s0, eps,
                      G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BQ: tl.constexpr, BN: tl.constexpr,
                      WINDOW: tl.constexpr, UNMASKED: tl.constexpr, FUSED: tl.constexpr, HAS_NORM: tl.constexpr,
                      OFFSET: tl.constexpr):
        """The partial state of query tokens first … first+BQ-1 (those before t_hi) over one chunk."""
        M: tl.constexpr = BQ * GP
        mi = tl.arange(0, M)
        ti, gi = mi // GP, mi % GP  # query vector = (token of the block, head of the group)
        head = h * G + gi
        dd = tl.arange(0, D)
        jn = tl.arange(0, BN)
        idx = first + ti
        tok_ok = idx < t_hi
        q_ok = tok_ok & (gi < G)
        tok = tl.load(qtok_ptr + idx, mask=tok_ok, other=0)
        qpos = tl.load(pos_ptr + tok, mask=tok_ok, other=0)
        q = _queries(q_ptr, qr_ptr, tok, head, q_ok, q_s0, q_s1, qr_s0, cos_ptr, sin_ptr, qw_ptr, eps, M, D, FUSED,
                     HAS_NORM, OFFSET)
        m_i = tl.full([M], float("-inf"), tl.float32)
        l_i = tl.zeros([M], tl.float32)
        acc = tl.zeros([M, D], tl.float32)
        k0 = _first_key(qpos, tok_ok, kpos0, window, BN, WINDOW)  # window: keys every query is past are skipped
        if UNMASKED:  # whole steps load without masks (wide unpredicated loads, no key test on the scores)
            full = nkeys // BN * BN
            for s in range(k0, full, BN):
                j = s + jn
                kt = tl.load(kh + j[None, :] * D + dd[:, None])
                sc = tl.dot(q, kt) * scale
                if WINDOW:
                    sc = tl.where(qpos[:, None] - (kpos0 + j)[None, :] < window, sc, float("-inf"))
                vt = tl.load(vh + j[:, None] * D + dd[None, :])
                m_i, l_i, acc = _online(sc, m_i, l_i, acc, vt)
            if full < nkeys:  # the chunk's last, partial step
                m_i, l_i, acc = _chunk_step(q, kh, vh, qpos, m_i, l_i, acc, full, nkeys, kpos0, scale, window, D, BN,
                                            WINDOW)
        else:
            for s in range(k0, nkeys, BN):
                m_i, l_i, acc = _chunk_step(q, kh, vh, qpos, m_i, l_i, acc, s, nkeys, kpos0, scale, window, D, BN,
                                            WINDOW)
        row = split * part_s_split + tok * n_heads + head  # (split, token, query head)
        tl.store(ml_ptr + row * 2, m_i, mask=q_ok)
        tl.store(ml_ptr + row * 2 + 1, l_i, mask=q_ok)
        tl.store(part_ptr + row[:, None] * D + dd[None, :], acc, mask=q_ok[:, None])

    @triton.jit
    def _rotated(src, ok, tok, cos_ptr, sin_ptr, w_ptr, eps, R: tl.constexpr, D: tl.constexpr,
                 HAS_NORM: tl.constexpr, OFFSET: tl.constexpr, like_ptr):
        """FUSED: rows [R, D] of heads from the QKV GEMM's output (`src` [R] each row's head, `tok` [R] its token),
        (normed and) rotated, rounded to like_ptr's dtype: the values the q/k/v kernel would have written there."""
        y1, y2 = rope_values(src, ok, tok, cos_ptr, sin_ptr, w_ptr, eps, D, HAS_NORM, OFFSET)
        return _halves(y1, y2, like_ptr, R, D)

    @triton.jit
    def _halves(y1, y2, like_ptr, R: tl.constexpr, D: tl.constexpr):
        """Rows [R, D] from their two halves [R, D/2], rounded to like_ptr's dtype."""
        dt = like_ptr.dtype.element_ty
        return tl.reshape(tl.permute(tl.join(y1.to(dt), y2.to(dt)), (0, 2, 1)), (R, D))  # [R, 2, D/2] → [R, D]

    @triton.jit
    def _query_inputs(q_ptr, qr_ptr, tok, head, q_ok, q_s0, q_s1, qr_s0, cos_ptr, sin_ptr, qw_ptr, M: tl.constexpr,
                      D: tl.constexpr, FUSED: tl.constexpr, HAS_NORM: tl.constexpr):
        """Every load of a program's query vectors (`tok`, `head` [M]: each one's token and head), nothing computed:
        FUSED, rope_inputs of the QKV GEMM's output; otherwise the query buffer's rows (and placeholders)."""
        if FUSED:
            return rope_inputs(qr_ptr + tok * qr_s0 + head * D, q_ok, tok, cos_ptr, sin_ptr, qw_ptr, D, HAS_NORM)
        else:
            dd = tl.arange(0, D)
            q = tl.load(q_ptr + tok[:, None] * q_s0 + head[:, None] * q_s1 + dd[None, :], mask=q_ok[:, None],
                        other=0.0)
            return q, q, q, q, q, q, q, q

    @triton.jit
    def _query_values(x1, x2, c1, c2, s1, s2, w1, w2, q_ptr, eps, M: tl.constexpr, D: tl.constexpr,
                      FUSED: tl.constexpr, HAS_NORM: tl.constexpr, OFFSET: tl.constexpr):
        """The query vectors [M, D] from _query_inputs' values: FUSED, (normed and) rotated, rounded to q_ptr's
        dtype (the values the q/k/v kernel would have written); otherwise the loaded rows as they are."""
        if FUSED:
            y1, y2 = rope_apply(x1, x2, c1, c2, s1, s2, w1, w2, eps, D, HAS_NORM, OFFSET)
            return _halves(y1, y2, q_ptr, M, D)
        else:
            return x1

    @triton.jit
    def _queries(q_ptr, qr_ptr, tok, head, q_ok, q_s0, q_s1, qr_s0, cos_ptr, sin_ptr, qw_ptr, eps, M: tl.constexpr,
                 D: tl.constexpr, FUSED: tl.constexpr, HAS_NORM: tl.constexpr, OFFSET: tl.constexpr):
        """A program's query vectors [M, D] (`tok`, `head` [M]: each one's token and head): FUSED, from the QKV GEMM's
        output (_rotated); otherwise from the query buffer."""
        x1, x2, c1, c2, s1, s2, w1, w2 = _query_inputs(q_ptr, qr_ptr, tok, head, q_ok, q_s0, q_s1, qr_s0, cos_ptr,
                                                       sin_ptr, qw_ptr, M, D, FUSED, HAS_NORM)
        return _query_values(x1, x2, c1, c2, s1, s2, w1, w2, q_ptr, eps, M, D, FUSED, HAS_NORM, OFFSET)
