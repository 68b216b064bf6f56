#!/usr/bin/env bash
# Issue 18's GPU runs in one command each (≤ 10 minutes; every step has its own time limit, and what a
# step leaves in $OUT comes back even when a later one fails):
#     QCLS_BENCH_COMMIT=<sha> bash bench/prefix_gpu.sh tune    # kernel tests, the sweep, prefix bench with its choice
#     QCLS_BENCH_COMMIT=<sha> bash bench/prefix_gpu.sh final   # kernel + engine GPU tests, both benchmarks as shipped
# tune:  the tree kernels' GPU tests (split = inline = dense SDPA), bench/attention.py --sweep (writes the
#        chosen shapes to $OUT/tuning.json), bench/prefix.py with those shapes.
# final: the GPU tests of the tree kernels and of the engine with them (fp16, CUDA graphs, split prefixes),
#        bench/attention.py and bench/prefix.py with the shipped shapes (tree_plan.TUNING).
# Logs, bench/RESULTS.md and the JSON files go to $OUT (default /tmp/qcls_prefix_gpu).
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-final}
source bench/gpu_steps.sh prefix_gpu 5000
if [ "$MODE" = tune ]; then
    step 110 gpu-tests python -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_attention.py
    step 290 attention python -m bench.attention --sweep --budget-s 120 --out-tuning "$OUT/tuning.json"
    tuning=()
    [ -f "$OUT/tuning.json" ] && tuning=(--tuning "$OUT/tuning.json")
    step 130 prefix python -m bench.prefix ${tuning[@]+"${tuning[@]}"} --iters 60
else
    step 200 gpu-tests python -m pytest -q -p no:cacheprovider -m gpu -k "tree or split or allocation" \
        tests/engine/test_attention.py tests/engine/test_gpu.py
    step 170 attention python -m bench.attention
    step 170 prefix python -m bench.prefix
fi
cp bench/RESULTS.md "$OUT/"
exit $rc
