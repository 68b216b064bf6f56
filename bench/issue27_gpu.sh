#!/usr/bin/env bash
# Issue 27 on a GPU in one command (every step has its own time limit; what a step leaves in $OUT comes back
# even when a later one fails):
#     QCLS_BENCH_COMMIT=<sha> bash bench/issue27_gpu.sh [steps...]     (default: offload host)
# offload: the fp16-offload GPU tests and the streamed path's max |Δ score| against fp16 (tiny Llama);
# kernels: the fused-kernel GPU tests (Triton against torch);
# host:    bench/host.py on random Qwen3-4B and Gemma3-4B × ecommerce8: host stages, each host step, cProfile, and
#          the per-kernel CUDA profile of a forward (non-GEMM share);
# gpu:     pytest -m gpu tests --ignore=tests/deployments --ignore=tests/test_results.py (both import ray).
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/gpu_steps.sh issue27_gpu 3000
steps=${*:-offload host}
for s in $steps; do
    case $s in
    offload)
        step 150 offload python -m pytest -q -m gpu tests/backends/test_offload.py -p no:cacheprovider
        step 120 offload-diff python bench/offload_diff.py ;;
    kernels) step 200 kernels python -m pytest -q -m gpu tests/engine/test_kernels.py -p no:cacheprovider ;;
    host)
        step 150 host-qwen python bench/host.py --model qwen3_4b --iters 200 --profile-iters 100
        step 150 host-gemma python bench/host.py --model gemma3_4b --iters 100 --profile-iters 50 ;;
    gpu) step ${GPU_TESTS_S:-500} gpu-tests python -m pytest -q -m gpu tests --ignore=tests/deployments --ignore=tests/test_results.py -p no:cacheprovider --durations=10 ;;
    *) echo "unknown step $s"; rc=1 ;;
    esac
done
cp bench/RESULTS.md "$OUT/"
exit $rc
