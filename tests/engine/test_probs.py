"""engine/probs.py: every (query, prompt) segment of the tail's scores softmaxed in float64 on the device,
against the host's softmax (classifier._softmax), through the torch ops (CPU) and the Triton kernel (its
interpreter on a CPU)."""
from __future__ import annotations

import random

import pytest
import torch

from qcls.results.building import softmax as _softmax
from qcls.engine.kernels import triton
from qcls.engine.probs import Probabilities


@pytest.mark.parametrize("b", [1, 4])
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_segment_softmax_equals_the_host_softmax(b, impl):
    if impl == "triton" and (triton is None or torch.cuda.is_available()):
        pytest.skip("the interpreted kernel runs on a CPU machine with Triton (a GPU runs it in the engine tests)")
    rng = random.Random(b)
    counts = [rng.randrange(1, 12) for _ in range(5)] + [1]  # a one-label prompt: probability 1
    probs = Probabilities(counts, b, torch.device("cpu"))
    n = sum(counts) * b
    scores = torch.tensor([rng.uniform(-60, 10) for _ in range(2 * n)], dtype=torch.float32)
    scores[3] = scores[4] = 5.0  # a tie
    out = probs(scores, impl=impl).tolist()
    assert len(out) == 4 * n
    assert out[:2 * n] == scores.double().tolist()  # the scores, exactly
    off = 0
    for _ in range(2 * b):
        for c in counts:
            want = _softmax(scores[off:off + c].tolist())
            got = out[2 * n + off:2 * n + off + c]
            assert got == pytest.approx(want, rel=1e-12, abs=1e-300), (off, c)
            off += c
    assert off == 2 * n


def test_split_blocks_reads_the_four_blocks_per_query_and_prompt():
    from qcls.engine.probs import split_blocks
    flat = [float(i) for i in range(4 * 10)]  # 2 queries × prompts of 3 and 2 labels: blocks of 10
    raw, cal, raw_p, cal_p = split_blocks(flat, 2, [3, 2])
    assert raw == [[[0, 1, 2], [3, 4]], [[5, 6, 7], [8, 9]]]
    assert cal == [[[10, 11, 12], [13, 14]], [[15, 16, 17], [18, 19]]]
    assert raw_p == [[[20, 21, 22], [23, 24]], [[25, 26, 27], [28, 29]]]
    assert cal_p == [[[30, 31, 32], [33, 34]], [[35, 36, 37], [38, 39]]]
