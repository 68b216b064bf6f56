"""The options of a bulk run (the `qcls bulk` flags), shared by both executors."""
from __future__ import annotations

from dataclasses import dataclass

# The bulk command's engine.max_batch_size on a GPU when neither --batch-size nor engine.max_batch_size is given: 8.
# On an H100 (bench/bulk.py, random Qwen3-4B × ecommerce8, the streaming pipeline, bench/RESULTS.md, "bulk: a
# 200,000-row query log") the file command gave 434 / 481 / 478 distinct queries/s at batch 4 / 8 / 16: 8 and 16 tie,
# and 8 starts in half the time (13.6 s against 29.0 s: 89 CUDA graphs against 186) in 0.85 GiB less. The T4
# projection favours 16 by 3 % (30 against 31 distinct/s), inside what a projection can tell. On the CPU the config's
# own (4) stays: there a bigger batch buys nothing and every batch size is warmed up eagerly.
GPU_BATCH_SIZE = 8
DEFAULT_BATCH_SIZE: int | None = None


@dataclass
class BulkOptions:
    input: str
    output: str
    overrides: list[str]
    column: str | None = None  # the query column of a CSV/TSV/JSONL/Parquet input (default "query")
    all_labels: bool = False
    quiet: bool = False
    batch_size: int | None = DEFAULT_BATCH_SIZE  # engine.max_batch_size for this run
    # rows per chunk: a part file each (what a resumed run skips), and the unit of dedupe before the cache
    chunk_rows: int = 65536
    # distinct queries whose results are kept (≈ 0.3-0.6 KB each with 8 prompts); 0 = dedupe within a chunk only
    cache_size: int = 1_000_000
    log_every_s: float = 10.0
    # Ray Data (ray_runner.py)
    ray: bool = False
    actors: int = 1
    address: str | None = None  # an existing cluster ("auto", "ray://host:10001", "host:6379"); None starts one
    gpus_per_actor: float | None = None  # None: 1 where the cluster has GPUs, else 0
    cpus_per_actor: float = 1.0
    ray_batch_rows: int | None = None  # rows per actor call (None: 4096 streamed, 2048 sorted by query hash)
    # sort the rows by query hash so that each distinct query goes to one actor (None: when actors > 1)
    shuffle: bool | None = None

    def all_overrides(self) -> list[str]:
        batch = self.batch_size
        chosen = any(o.split("=", 1)[0].lstrip("+~") == "engine.max_batch_size" for o in self.overrides)
        if batch is None and not chosen and _on_gpu(self.overrides):
            batch = GPU_BATCH_SIZE
        extra = [f"engine.max_batch_size={batch}"] if batch else []
        return list(self.overrides) + extra


def _on_gpu(overrides: list[str]) -> bool:
    """Whether the run's backend will use a GPU (backend.device=cpu keeps it on the CPU)."""
    if any(o.replace(" ", "") == "backend.device=cpu" for o in overrides):
        return False
    import torch
    return torch.cuda.is_available()
