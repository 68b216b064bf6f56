#!/usr/bin/env bash
# Issues 17 and 18 (item 3) on a GPU in one command (≤ 10 minutes; every step has its own time limit, and what
# a step leaves in $OUT comes back even when a later one fails):
#     QCLS_BENCH_COMMIT=<sha> bash bench/heads_gpu.sh
# 1. GPU tests of heads, calibration, kernels and fp16 fidelity (fast fp16 as close to fp32 as transformers
#    fp16);
# 2. bench/paired.py: a head on layer 18 (both reads + scores: the heavier path, what the demo's heads read)
#    against none, the float32 residual stream against the pre-issue-18 kernels, and the few-shot ecommerce8
#    prompts against the zero-shot ones, each timed in alternation at batch 1 and 4;
# 3. bench/fidelity.py: random-weight Qwen3-4B, final norm ×20, ecommerce8, 16 queries: a head's fp16
#    probabilities against fp32, max |Δ score| of fast fp16 and transformers fp16 against fp32, layer by layer.
# (bench/norm.py, the norm kernel per warps setting, runs on its own: python bench/norm.py)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/qcls_heads_gpu}
mkdir -p "$OUT"
export OUT PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
rc=0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
step() {  # step SECONDS NAME COMMAND...: run with a time limit, keep its log, show its tail
    local limit=$1 name=$2
    shift 2
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1 || { echo "== $name failed or ran out of time ($limit s)"; rc=1; }
    echo "== $name"
    tail -c 3000 "$OUT/$name.log"
}
step 110 gpu-tests python -m pytest -q -p no:cacheprovider -m gpu -s tests/engine/test_heads_engine.py \
    tests/engine/test_calibration_engine.py "tests/engine/test_gpu.py::test_fast_fp16_is_as_close_to_fp32_as_transformers_fp16" \
    "tests/engine/test_gpu.py::test_no_allocation_or_capture_on_request_path" tests/engine/test_kernels.py
P="python -m bench.paired --model qwen3_4b --iters 120"
step 75 paired-head-layer $P --a prompts=ecommerce8 --b "prompts=ecommerce8 calibration=random_head:18:both:scores" \
    --label "head on layer 18 (position + query mean) + raw scores off / on (request path)"
step 75 paired-fp32 $P --a prompts=ecommerce8 --b prompts=ecommerce8 --legacy-kernels a \
    --label "pre-issue-18 kernels (fp16 residual) / float32 residual stream (request path)"
step 75 paired-fewshot $P --a prompts=ecommerce8 --b prompts=ecommerce8_fewshot \
    --label "ecommerce8 / ecommerce8_fewshot (few-shot prefixes, request path)"
step 225 fidelity python bench/fidelity.py --model qwen3_4b --queries 16 --head-queries 4 --parts heads strategies layers
cp bench/RESULTS.md "$OUT/"
exit $rc
