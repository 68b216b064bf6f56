"""Memory as the device holds it now, beside the estimate made before loading (memory.py): what torch's allocator
holds after start-up (`measured`), a serving process's memory at any time (`memory_now`: growth over minutes is a
leak) and the release of what a dropped Classifier left cached (`free_device_memory`)."""
from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from qcls.classifier import Classifier


def measured(device: torch.device | str | None = None) -> dict[str, int]:
    """What torch's allocator holds now and at its peak, and the card's used/total (context included).
    Empty off CUDA."""
    dev = torch.device(device) if device is not None else None
    if (dev is not None and dev.type != "cuda") or not torch.cuda.is_available():
        return {}
    free, total = torch.cuda.mem_get_info(dev)
    return {"gpu_allocated": torch.cuda.memory_allocated(dev), "gpu_peak": torch.cuda.max_memory_allocated(dev),
            "gpu_reserved": torch.cuda.memory_reserved(dev), "gpu_used_device": total - free,
            "gpu_total_device": total}


def memory_now(device) -> dict[str, int | None]:
    """This process's resident memory and, on a CUDA device, what torch has allocated and reserved there (bytes;
    reserved includes the CUDA graphs' pools); growth over minutes is a leak."""
    try:  # Linux: current RSS (resource.getrusage gives only the peak)
        rss = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        rss = None
    out = {"rss": rss, "cuda_allocated": None, "cuda_reserved": None}
    if getattr(device, "type", None) == "cuda":
        out.update(cuda_allocated=torch.cuda.memory_allocated(device), cuda_reserved=torch.cuda.memory_reserved(device))
    return out


def free_device_memory(clf: "Classifier") -> tuple[float, float, float] | None:
    """Give the cached blocks of tensors that are garbage now back to the device: a failed build's (an
    out-of-memory build, above all) or a replaced configuration's. Returns the GiB torch's allocator reserved
    before and after, and the GiB allocated (None off CUDA). Run by the device's owner: empty_cache synchronizes the
    whole device."""
    device = getattr(clf.loaded, "device", None)
    if getattr(device, "type", None) != "cuda":
        return None
    gc.collect()
    before = torch.cuda.memory_reserved(device) / 2**30
    torch.cuda.empty_cache()
    return before, torch.cuda.memory_reserved(device) / 2**30, torch.cuda.memory_allocated(device) / 2**30
