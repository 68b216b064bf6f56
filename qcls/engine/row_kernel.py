"""The tree attention's row kernel (qcls/engine/attention.py launches it, tree_plan.py plans it; the prefix
kernel and the steps both kernels share are in tree_kernels.py).

`row_kernel`: one program = one tile (≤ TILE tokens of one row) × one KV head (or, HS > 1, one of HS parts of its
group of query heads: more, smaller programs where the grid is small). It starts from the tile's prefix state,
merging the partials of its prompt's chunks or, for short prefixes, walking the prefix itself (one launch instead
of two), adds the row's own keys (causal / trie ancestry), normalises and writes the output. FUSED: see
tree_kernels.py (the row's keys in registers with KEYS_REG, else through the KV buffer).
"""
from __future__ import annotations

from qcls.engine.tree_kernels import triton

if triton is not None:
    import triton.language as tl

    from qcls.engine.qkv_kernels import rope_values
    from qcls.engine.tree_kernels import (_RUN, _chunk_kv, _chunk_step, _first_key, _merge, _online, _queries,
                                          _query_inputs, _query_values, _rotated, _step_scores)

    @triton.jit
    def _indices(pos_ptr, seq_ptr, anc_ptr, rp, tok, tok_ok):
        """The row part's tokens' position, sequence index (int32: fewer registers held) and trie ancestry, and the
        first run of its prompt's prefix (`rp`: the prompt's row of the runs table, which every prompt has)."""
        pos_i = tl.load(pos_ptr + tok, mask=tok_ok, other=0).to(tl.int32)
        seq_i = tl.load(seq_ptr + tok, mask=tok_ok, other=0).to(tl.int32)
        anc_i = tl.load(anc_ptr + tok, mask=tok_ok, other=0)
        return pos_i, seq_i, anc_i, tl.load(rp), tl.load(rp + 1), tl.load(rp + 2)

    @triton.jit
    def _key_indices(seq_ptr, tslot_ptr, pos_ptr, r0, rlen, s, BN: tl.constexpr):
        """Sequence index, trie slot (-1: a sequence key) and position of the row's keys s … s+BN-1."""
        jn = tl.arange(0, BN)
        j_ok = s + jn < rlen
        key = r0 + s + jn
        return (tl.load(seq_ptr + key, mask=j_ok, other=0).to(tl.int32),
                tl.load(tslot_ptr + key, mask=j_ok, other=-1).to(tl.int32),
                tl.load(pos_ptr + key, mask=j_ok, other=0).to(tl.int32))

    @triton.jit
    def _row_keys(k_ptr, v_ptr, kr_ptr, vr_ptr, cos_ptr, sin_ptr, kw_ptr, r0, rlen, pool_len, kr_s0, vr_s0, eps,
                  D: tl.constexpr, BN: tl.constexpr, HAS_NORM: tl.constexpr, OFFSET: tl.constexpr):
        """FUSED without KEYS_REG: the keys (k-normed and rotated) and values of one row and KV head (k_ptr, v_ptr:
        that head's buffers) from the QKV GEMM's output into the KV buffer, at the slots the row part reads, then a
        barrier that makes them visible to the program."""
        half: tl.constexpr = D // 2
        jn = tl.arange(0, BN)
        i = tl.arange(0, half)[None, :]
        dd = tl.arange(0, D)[None, :]
        for s in range(0, rlen, BN):
            key = r0 + s + jn
            ok = s + jn < rlen
            dst = k_ptr + (pool_len + key)[:, None] * D
            y1, y2 = rope_values(kr_ptr + key * kr_s0, ok, key, cos_ptr, sin_ptr, kw_ptr, eps, D, HAS_NORM, OFFSET)
            tl.store(dst + i, y1.to(k_ptr.dtype.element_ty), mask=ok[:, None])
            tl.store(dst + half + i, y2.to(k_ptr.dtype.element_ty), mask=ok[:, None])
            tl.store(v_ptr + (pool_len + key)[:, None] * D + dd,
                     tl.load(vr_ptr + key[:, None] * vr_s0 + dd, mask=ok[:, None]), mask=ok[:, None])
        tl.debug_barrier()

    @triton.jit
    def _prefix_step(q, kh, vh, qpos, m_i, l_i, acc, s, nkeys, kpos0, scale, window, D: tl.constexpr,
                     BN: tl.constexpr, WINDOW: tl.constexpr, slot0, VK: tl.constexpr):
        """_chunk_step, or with VK the values loaded with the keys (before the scores' dot)."""
        if VK:
            kt, vt = _chunk_kv(kh, vh, slot0, s, nkeys, D, BN)
            sc = _step_scores(q, kt, qpos, s, nkeys, kpos0, scale, window, BN, WINDOW)
            return _online(sc, m_i, l_i, acc, vt)
        else:
            return _chunk_step(q, kh, vh, qpos, m_i, l_i, acc, s, nkeys, kpos0, scale, window, D, BN, WINDOW, slot0)

    @triton.jit
    def _row_values(vh, vr_ptr, key, slot, j_ok, vr_s0, D: tl.constexpr, FROM_GEMM: tl.constexpr):
        """The values [BN, D] of a step of the row's keys: from the QKV GEMM's output (KEYS_REG) or the KV buffer."""
        dd = tl.arange(0, D)
        if FROM_GEMM:
            return tl.load(vr_ptr + key[:, None] * vr_s0 + dd[None, :], mask=j_ok[:, None], other=0.0)
        else:
            return tl.load(vh + slot[:, None] * D + dd[None, :], mask=j_ok[:, None], other=0.0)

    @triton.jit
    def row_kernel(q_ptr, k_ptr, v_ptr, o_ptr, seq_ptr, anc_ptr, tslot_ptr, pos_ptr, tiles_ptr, runs_ptr,
                   nrun_ptr, nsplit_ptr, part_ptr, ml_ptr, qr_ptr, kr_ptr, vr_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr,
                   pool_len, runs_stride, q_s0, q_s1, o_s0, kv_s_head, part_s_split, qr_s0, kr_s0, vr_s0, n_heads,
                   scale, window, eps,
                   G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, TILE: tl.constexpr, BT: tl.constexpr,
                   BN: tl.constexpr, WINDOW: tl.constexpr, FUSED: tl.constexpr, HAS_NORM: tl.constexpr,
                   OFFSET: tl.constexpr, KEYS_REG: tl.constexpr, HS: tl.constexpr, EARLY: tl.constexpr,
                   EARLY_Q: tl.constexpr, EARLY_KV: tl.constexpr, VK: tl.constexpr):
        tile = tl.program_id(0)
        hq = tl.program_id(1)  # its query heads are hq·G … hq·G+G-1 (G: the group's heads / HS)
        h = hq // HS  # their KV head
        t0 = tl.load(tiles_ptr + tile * 5)
        cnt = tl.load(tiles_ptr + tile * 5 + 1)
        r0 = tl.load(tiles_ptr + tile * 5 + 2)
        rlen = tl.load(tiles_ptr + tile * 5 + 3)
        prompt = tl.load(tiles_ptr + tile * 5 + 4)
        nrun = tl.load(nrun_ptr + prompt)  # prefix runs walked here (0 when the prefix kernel did it)
        nsplit = tl.load(nsplit_ptr + prompt)  # partial states the prefix kernel left for this prompt
        # BT < TILE where a whole tile's query vectors would not fit the registers (d=256 on sm_75). Unused tiles
        # (count 0) do nothing; every row has a used one, and its first part writes the row's keys (not KEYS_REG)
        for sub in tl.static_range(TILE // BT):
            if sub * BT < cnt:
                _row_part(q_ptr, k_ptr, v_ptr, o_ptr, seq_ptr, anc_ptr, tslot_ptr, pos_ptr, runs_ptr, ml_ptr,
                          part_ptr, t0 + sub * BT, cnt - sub * BT, r0, rlen, prompt, nrun, nsplit, pool_len,
                          runs_stride, q_s0, q_s1, o_s0, kv_s_head, part_s_split, n_heads, scale, window, h, hq,
                          qr_ptr, kr_ptr + h * D, vr_ptr + h * D, cos_ptr, sin_ptr, qw_ptr, kw_ptr, qr_s0, kr_s0, vr_s0,
                          eps, G, GP, D, BT, BN, WINDOW, FUSED, HAS_NORM, OFFSET, KEYS_REG, EARLY,
                          FUSED and not KEYS_REG and sub == 0, EARLY_Q, EARLY_KV and EARLY, VK)

    @triton.jit
    def _row_part(q_ptr, k_ptr, v_ptr, o_ptr, seq_ptr, anc_ptr, tslot_ptr, pos_ptr, runs_ptr, ml_ptr, part_ptr,
                  t0, cnt, r0, rlen, prompt, nrun, nsplit, pool_len, runs_stride, q_s0, q_s1, o_s0, kv_s_head,
                  part_s_split, n_heads, scale, window, h, hq, qr_ptr, kr_ptr, vr_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr,
                  qr_s0, kr_s0, vr_s0, eps, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BT: tl.constexpr,
                  BN: tl.constexpr, WINDOW: tl.constexpr, FUSED: tl.constexpr, HAS_NORM: tl.constexpr,
                  OFFSET: tl.constexpr, KEYS_REG: tl.constexpr, EARLY: tl.constexpr, WRITE_KEYS: tl.constexpr,
                  EARLY_Q: tl.constexpr, EARLY_KV: tl.constexpr, VK: tl.constexpr):
        """Up to BT tokens of one row (from t0; `cnt` left in the tile) for query heads hq·G … hq·G+G-1 of KV head h
        (FUSED: kr_ptr / vr_ptr point at that head's keys / values in the QKV GEMM's output; WRITE_KEYS: write the
        row's keys and values into the KV buffer first, _row_keys)."""
        M: tl.constexpr = BT * GP
        mi = tl.arange(0, M)
        ti, gi = mi // GP, mi % GP
        tok = t0 + ti
        tok_ok = ti < cnt
        q_ok = tok_ok & (gi < G)
        head = hq * G + gi
        dd = tl.arange(0, D)
        jn = tl.arange(0, BN)
        rp = runs_ptr + prompt * runs_stride
        # EARLY: every load that waits for no other goes before the first barrier (the row keys' store, the q norm's
        # reduction, a dot). A load placed after a barrier cannot be issued before it, so each such group of loads
        # was one more memory round trip on the program's chain. Without EARLY (sm_75 at d=256, where these values
        # held across the row's keys and the rotation cost spills) they come after the rotation.
        if EARLY:  # and the first step of the row's keys (later steps: one step ahead)
            pos_i, seq_i, anc_i, slot0, nkeys, kpos0 = _indices(pos_ptr, seq_ptr, anc_ptr, rp, tok, tok_ok)
            seq_j, ts_j, pos_j = _key_indices(seq_ptr, tslot_ptr, pos_ptr, r0, rlen, 0, BN)
        kh = k_ptr + h * kv_s_head
        vh = v_ptr + h * kv_s_head
        # EARLY_Q (WRITE_KEYS): the query vectors' loads before the row keys' barrier, their arithmetic after it;
        # EARLY_KV (with EARLY): the first step of the prompt's prefix (run 0, keys 0 … BN-1) loaded there too
        if EARLY_Q:
            x1, x2, c1, c2, s1, s2, w1, w2 = _query_inputs(q_ptr, qr_ptr, tok, head, q_ok, q_s0, q_s1, qr_s0, cos_ptr,
                                                           sin_ptr, qw_ptr, M, D, FUSED, HAS_NORM)
        if EARLY_KV:
            kt0, vt0 = _chunk_kv(kh, vh, slot0, 0, tl.where(nrun > 0, nkeys, 0), D, BN)
        if WRITE_KEYS:
            _row_keys(kh, vh, kr_ptr, vr_ptr, cos_ptr, sin_ptr, kw_ptr, r0, rlen, pool_len, kr_s0, vr_s0, eps, D, BN,
                      HAS_NORM, OFFSET)
        if EARLY_Q:
            q = _query_values(x1, x2, c1, c2, s1, s2, w1, w2, q_ptr, eps, M, D, FUSED, HAS_NORM, OFFSET)
        else:
            q = _queries(q_ptr, qr_ptr, tok, head, q_ok, q_s0, q_s1, qr_s0, cos_ptr, sin_ptr, qw_ptr, eps, M, D, FUSED,
                         HAS_NORM, OFFSET)
        if not EARLY:
            pos_i, seq_i, anc_i, slot0, nkeys, kpos0 = _indices(pos_ptr, seq_ptr, anc_ptr, rp, tok, tok_ok)

        m_i = tl.full([M], float("-inf"), tl.float32)
        l_i = tl.zeros([M], tl.float32)
        acc = tl.zeros([M, D], tl.float32)
        # 1a. the prefix kernel's partial states, one per chunk of the prompt's prefix
        for s in range(0, nsplit):
            row = s * part_s_split + tok * n_heads + head
            m_s = tl.load(ml_ptr + row * 2, mask=q_ok, other=float("-inf"))
            l_s = tl.load(ml_ptr + row * 2 + 1, mask=q_ok, other=0.0)
            a_s = tl.load(part_ptr + row[:, None] * D + dd[None, :], mask=q_ok[:, None], other=0.0)
            m_i, l_i, acc = _merge(m_i, l_i, acc, m_s, l_s, a_s)
        # 1b. or the prompt's cached prefix walked here, run by run of contiguous slots (addresses from the loop
        # index, not from a slot table: no dependent load per step): every key visible (within the window)
        r_first = 0
        if EARLY_KV:  # run 0 here, its first step from the keys and values loaded early (unless the window skips it)
            r_first = 1
            if nrun > 0:
                k0 = _first_key(pos_i, tok_ok, kpos0, window, BN, WINDOW)
                if k0 == 0:
                    sc = _step_scores(q, kt0, pos_i, 0, nkeys, kpos0, scale, window, BN, WINDOW)
                    m_i, l_i, acc = _online(sc, m_i, l_i, acc, vt0)
                    k0 = k0 + BN  # (a tensor in both branches)
                for s in range(k0, nkeys, BN):
                    m_i, l_i, acc = _prefix_step(q, kh, vh, pos_i, m_i, l_i, acc, s, nkeys, kpos0, scale, window, D,
                                                 BN, WINDOW, slot0, VK)
        for r in range(r_first, nrun):
            if r > 0:  # (run 0 came with the indices)
                slot0 = tl.load(rp + r * _RUN)
                nkeys = tl.load(rp + r * _RUN + 1)
                kpos0 = tl.load(rp + r * _RUN + 2)
            for s in range(_first_key(pos_i, tok_ok, kpos0, window, BN, WINDOW), nkeys, BN):
                m_i, l_i, acc = _prefix_step(q, kh, vh, pos_i, m_i, l_i, acc, s, nkeys, kpos0, scale, window, D, BN,
                                             WINDOW, slot0, VK)
        # 2. the token's own row: sequence keys causally, trie keys if they are ancestors-or-self
        for s in range(0, rlen, BN):
            j_ok = s + jn < rlen
            key = r0 + s + jn
            if EARLY:
                seq_n, ts_n, pos_n = _key_indices(seq_ptr, tslot_ptr, pos_ptr, r0, rlen, s + BN, BN)
            else:
                seq_j, ts_j, pos_j = _key_indices(seq_ptr, tslot_ptr, pos_ptr, r0, rlen, s, BN)
            causal = seq_j[None, :] <= seq_i[:, None]
            tree = ((anc_i[:, None] >> tl.maximum(ts_j, 0)[None, :]) & 1) != 0
            vis = tl.where(ts_j[None, :] < 0, causal, tree) & j_ok[None, :]
            if WINDOW:
                vis = vis & (pos_i[:, None] - pos_j[None, :] < window)
            slot = pool_len + key
            if FUSED and KEYS_REG:  # the row's keys from the QKV GEMM's output, rotated here (every tile does it)
                kt = tl.trans(_rotated(kr_ptr + key * kr_s0, j_ok, key, cos_ptr, sin_ptr, kw_ptr, eps, BN, D, HAS_NORM,
                                       OFFSET, k_ptr))
            else:
                kt = tl.load(kh + slot[None, :] * D + dd[:, None], mask=j_ok[None, :], other=0.0)
            if VK:  # the values' load issued with the keys', not after the scores
                vt = _row_values(vh, vr_ptr, key, slot, j_ok, vr_s0, D, FUSED and KEYS_REG)
            sc = tl.where(vis, tl.dot(q, kt) * scale, float("-inf"))
            if not VK:
                vt = _row_values(vh, vr_ptr, key, slot, j_ok, vr_s0, D, FUSED and KEYS_REG)
            m_i, l_i, acc = _online(sc, m_i, l_i, acc, vt)
            if EARLY:
                seq_j, ts_j, pos_j = seq_n, ts_n, pos_n

        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(o_ptr + tok[:, None] * o_s0 + head[:, None] * D + dd[None, :], o.to(o_ptr.dtype.element_ty),
                 mask=q_ok[:, None])
