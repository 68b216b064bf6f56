"""The bulk command's batch size: 8 on a GPU unless the user chose one (bench/RESULTS.md), the config's on the CPU."""
from __future__ import annotations

import torch

from qcls.bulk.options import GPU_BATCH_SIZE, BulkOptions


def test_batch_size_default_follows_the_device_and_never_overrides_a_choice(monkeypatch):
    def opts(overrides, **kw):
        return BulkOptions("in.txt", "out.jsonl", overrides, **kw).all_overrides()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert opts(["prompts=ecommerce8"]) == ["prompts=ecommerce8"]  # CPU: the config's own
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert opts([]) == [f"engine.max_batch_size={GPU_BATCH_SIZE}"] and GPU_BATCH_SIZE == 8
    assert opts(["engine.max_batch_size=2"]) == ["engine.max_batch_size=2"]  # the user's choice stands
    assert opts([], batch_size=16) == ["engine.max_batch_size=16"]  # --batch-size
    assert opts(["backend.device=cpu"]) == ["backend.device=cpu"]


def test_ray_flags_reach_the_options(monkeypatch):
    """--ray, --actors, --address and --no-shuffle as the Ray runner gets them (several actors sort the rows by
    query hash unless --no-shuffle; the runner decides from shuffle=None)."""
    from qcls.cli import commands as cli
    from qcls.bulk import ray_runner
    got = []
    monkeypatch.setattr(ray_runner, "run", lambda opts: got.append(opts) or {"rows": 0, "errors": {}})
    assert cli.main(["bulk", "in.txt", "out.parquet", "--ray", "--actors", "4"]) == 0
    assert cli.main(["bulk", "in.txt", "out.parquet", "--address", "auto", "--actors", "2", "--no-shuffle"]) == 0
    assert [(o.ray, o.actors, o.address, o.shuffle) for o in got] == [(True, 4, None, None), (False, 2, "auto", False)]
