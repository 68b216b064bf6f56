"""What the device holds now, off CUDA: nothing to read from torch's allocator and nothing to give back."""
from __future__ import annotations

import types

import torch

from qcls.backends.device_memory import free_device_memory, measured, memory_now


def test_off_cuda_only_the_process_memory_is_read(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert measured("cpu") == {}
    now = memory_now(torch.device("cpu"))
    assert now["rss"] > 0 and now["cuda_allocated"] is None and now["cuda_reserved"] is None
    assert free_device_memory(types.SimpleNamespace(loaded=types.SimpleNamespace(device=torch.device("cpu")))) is None
