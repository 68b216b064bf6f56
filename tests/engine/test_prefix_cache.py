"""Prefix KV pool planning: chain-hashed blocks, shared blocks stored once, partial last blocks."""
from __future__ import annotations

from qcls.engine.prefix_cache import chain_hash, plan_prefixes


def test_shared_leading_blocks_get_the_same_slots():
    header = tuple(range(100, 108))  # two full blocks of 4
    a, b = header + (1, 2, 3), header + (7, 8)
    plan = plan_prefixes([a, b], block_size=4)
    assert plan.prompt_slots(0)[:8] == plan.prompt_slots(1)[:8]
    assert plan.stats() == {"blocks": 4, "shared_blocks": 2, "slots": 8 + 3 + 2, "prefix_tokens": 11 + 10,
                            "tokens_saved": 8}
    assert plan.new_blocks[1] == [3]  # the second prompt computes only its own tail
    assert len(set(plan.prompt_slots(0)) | set(plan.prompt_slots(1))) == plan.n_slots


def test_same_tokens_after_a_different_parent_are_not_shared():
    a = (1, 2, 3, 4, 9, 9, 9, 9)
    b = (5, 6, 7, 8, 9, 9, 9, 9)  # second block equal, parent differs: different KV
    plan = plan_prefixes([a, b], block_size=4)
    assert plan.stats()["shared_blocks"] == 0 and plan.n_slots == 16
    assert chain_hash(b"", (9, 9, 9, 9)) != chain_hash(chain_hash(b"", (1, 2, 3, 4)), (9, 9, 9, 9))


def test_identical_prompts_and_empty_prefixes():
    plan = plan_prefixes([(1, 2, 3), (1, 2, 3), ()], block_size=16)
    assert plan.n_slots == 3 and plan.prompt_slots(0) == plan.prompt_slots(1) == [0, 1, 2]
    assert plan.prompt_slots(2) == [] and plan.new_blocks[1] == []
