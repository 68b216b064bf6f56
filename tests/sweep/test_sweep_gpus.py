"""qcls/sweep/sweep_gpus.py's split of one multirun over several devices: every job runs on exactly one device, and
the split key keeps model loads apart when it can. (The processes themselves: run the script, docs/serving.md.)"""
from __future__ import annotations

from itertools import product

import pytest

pytest.importorskip("hydra")

from qcls.sweep.sweep_gpus import plan, swept  # noqa: E402


def jobs(args: list[str]) -> set[frozenset[str]]:
    """Every job of a multirun as its set of key=value overrides."""
    values = {s[0]: [f"{s[1]}={v}" for v in s[2]] for s in swept(args)}
    choices = [values.get(i, [a]) for i, a in enumerate(args) if "=" in a]
    return {frozenset(c) for c in product(*choices)}


def split_jobs(args: list[str], n: int, forced: str | None = None):
    key, per_device, total = plan(args, n, forced)
    mine = [jobs(a) for a in per_device]
    assert sum(len(m) for m in mine) == len(set().union(*mine)) == total  # no job twice
    assert set().union(*mine) == jobs(args)  # and none left out
    return key, per_device, mine


def test_a_loading_key_with_a_value_per_device_splits_the_jobs():
    args = ["-m", "scoring=trie,exact", "backend=fp16,bnb-int8", "eval.limit=5"]
    key, per_device, mine = split_jobs(args, 2)
    assert key == "backend"  # each device loads one model, and reuses it for its jobs
    assert per_device == [["-m", "scoring=trie,exact", "backend=fp16", "eval.limit=5"],
                          ["-m", "scoring=trie,exact", "backend=bnb-int8", "eval.limit=5"]]


def test_otherwise_the_key_with_the_most_values():
    args = ["-m", "scoring=trie,first_token,exact,mean_logprob", "prompts=default,ecommerce8", "model=qwen3_4b"]
    key, per_device, mine = split_jobs(args, 3)
    assert key == "scoring" and [len(m) for m in mine] == [4, 2, 2]
    assert "scoring=trie,mean_logprob" in per_device[0]


def test_fewer_values_than_devices_leaves_devices_idle_and_split_can_be_forced():
    key, per_device, _ = split_jobs(["-m", "scoring=trie,exact", "prompts=default,ecommerce8,default_fewshot"], 4,
                                    forced="scoring")
    assert key == "scoring" and len(per_device) == 2


def test_a_sweep_without_swept_keys_is_refused():
    with pytest.raises(SystemExit, match="nothing is swept"):
        plan(["scoring=trie"], 2)
