"""The options of a bulk run (the `qcls bulk` flags), shared by both executors."""
from __future__ import annotations

from dataclasses import dataclass

# The bulk command's engine.max_batch_size when --batch-size is not given. None: the config's own
# (engine.max_batch_size, 4) until bench/bulk.py has measured 4 / 8 / 16 on the GPU.
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
    ray_batch_rows: int = 4096  # rows per map_batches call (each actor dedupes within and across its calls)
    pool_timeout_s: int = 1800  # how long the pool may take to reach its full size before the run fails

    def all_overrides(self) -> list[str]:
        extra = [f"engine.max_batch_size={self.batch_size}"] if self.batch_size else []
        return list(self.overrides) + extra
