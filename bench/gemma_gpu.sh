#!/usr/bin/env bash
# Issue 20 (Gemma3-4B shapes) and issue 17's head fidelity on a GPU in one command (≤ 10 minutes; every step has
# its own time limit, and what a step leaves in $OUT comes back even when a later one fails):
#     QCLS_BENCH_COMMIT=<sha> bash bench/gemma_gpu.sh
# 1. bench/latency.py --models qwen3_4b gemma3_4b: random-weight Qwen3-4B and Gemma3-4B (its published text
#    config; the Qwen tokenizer gives the token counts) in one run: 2 and 8 prompts, batch 1 and 4, the
#    weight-read floor, first request, CUDA allocations per request, the fp16 reference's scores, T4 projection;
# 2. bench/fidelity.py --sharpen 1 --parts heads: random-weight Qwen3-4B × ecommerce8, a random head's
#    probabilities on the fast fp16 engine and on transformers fp16, each against the fp32 reference engine.
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/gpu_steps.sh gemma_gpu 6000
step 330 latency python bench/latency.py --models gemma3_4b qwen3_4b --no-baselines --no-sdpa-ab --iters 40 \
    --json "$OUT/latency.json"
step 200 fidelity-heads python bench/fidelity.py --model qwen3_4b --head-queries 6 --sharpen 1 --parts heads
cp bench/RESULTS.md "$OUT/"
exit $rc
