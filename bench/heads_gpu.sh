#!/usr/bin/env bash
# Issues 17 and 18 (item 3) on a GPU, one command per mode (≤ 10 minutes; every step has its own time limit,
# and what a step leaves in $OUT comes back even when a later one fails):
#     QCLS_BENCH_COMMIT=<sha> bash bench/heads_gpu.sh [heads|pairs]
# heads (default):
#   1. GPU tests of heads and calibration (fast fp16 = fp32 reference with the same head on a tiny model);
#   2. bench/paired.py: a head on layer 18 (both reads + scores: the heavier path, what the demo's heads read)
#      against none, timed in alternation at batch 1 and 4 (CUDA graphs of both sides counted);
#   3. bench/fidelity.py --sharpen 1 --parts heads: random-weight Qwen3-4B, ecommerce8, a random head's
#      probabilities on the fast fp16 engine and on transformers fp16, each against the fp32 reference;
#   4. bench/fidelity.py --parts strategies layers: the same model with the final norm ×20 (sharpened
#      logits), 16 queries: max |Δ score| of fast fp16 and transformers fp16 against fp32, layer by layer.
# pairs: the GPU kernel tests, then in alternation the few-shot ecommerce8 prompts against the zero-shot ones.
# (The pre-issue-18 kernels' pair and bench/norm.py went in issue 27 with bench/legacy_*.py: numbers in RESULTS.md.)
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/gpu_steps.sh heads_gpu 3000
MODE=${1:-heads}
P="python -m bench.paired --model qwen3_4b --iters 120"
if [ "$MODE" = heads ]; then
    step 90 gpu-tests python -m pytest -q -p no:cacheprovider -m gpu -s tests/engine/test_heads_engine.py \
        tests/engine/test_calibration_engine.py
    step 75 paired-head-layer $P --a prompts=ecommerce8 --b "prompts=ecommerce8 calibration=random_head:18:both:scores" \
        --label "head on layer 18 (position + query mean) + raw scores off / on (request path)"
    step 100 fidelity-heads python bench/fidelity.py --model qwen3_4b --head-queries 6 --sharpen 1 --parts heads
    step 290 fidelity python bench/fidelity.py --model qwen3_4b --queries 16 --parts strategies layers
else
    step 110 gpu-tests python -m pytest -q -p no:cacheprovider -m gpu \
        "tests/engine/test_gpu.py::test_fast_fp16_is_as_close_to_fp32_as_transformers_fp16" \
        "tests/engine/test_gpu.py::test_no_allocation_or_capture_on_request_path" tests/engine/test_kernels.py
    step 75 paired-fewshot $P --a prompts=ecommerce8 --b prompts=ecommerce8_fewshot \
        --label "ecommerce8 / ecommerce8_fewshot (few-shot prefixes, request path)"
fi
cp bench/RESULTS.md "$OUT/"
exit $rc
