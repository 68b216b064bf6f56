#!/usr/bin/env bash
# Issue 27's acceptance on a GPU, two commands of ≤ 10 minutes each in one lease (every step has its own time
# limit; what a step leaves in $OUT comes back even when a later one fails). BASE is a plain checkout of the
# baseline commit f728a0a beside this one (git archive f728a0a | tar -x -C BASE):
#     BASE=../.dev27base QCLS_BENCH_COMMIT=<sha> bash bench/issue27_accept.sh latency
#     QCLS_BENCH_COMMIT=<sha> bash bench/issue27_accept.sh rest
#     bash bench/issue27_accept.sh gpu
# latency: bench/latency.py of the baseline's checkout, then of this one (with REPEAT_BASE=1 the baseline again
#          after it: B, N, B, drift shows as the two B runs' difference), random Qwen3-4B and Gemma3-4B, 2 and 8
#          prompts, batch 1 and 4:
#          end-to-end p50, stages, CUDA allocations per request, kernel time by type; each checkout's own code.
# rest:    bench/host.py (host stages, never-seen batches, each host step, graph and allocation counts, the
#          per-kernel profile and non-GEMM share; Qwen3-4B and Gemma3-4B), bench/paired.py with the blocked q/k/v
#          kernel against the one-head one (engine.qkv_heads_per_program=1) in alternation, the same with
#          Gemma3-4B together with the fused post-norms (engine.fuse_post_norms=false on side a), bench/fidelity.py
#          (fast fp16 against the fp32 reference).
# gpu:     the GPU tests (pytest -m gpu without the Ray ones; ~330 s on an H100).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/qcls_issue27_accept}
mkdir -p "$OUT"
export OUT PYTHONUNBUFFERED=1
rc=0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
step() {  # step SECONDS NAME DIR COMMAND...: run in DIR with a time limit, keep its log, show its tail
    local limit=$1 name=$2 dir=$3
    shift 3
    (cd "$dir" && PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout "$limit" "$@") > "$OUT/$name.log" 2>&1 \
        || { echo "== $name failed or ran out of time ($limit s)"; rc=1; }
    echo "== $name"
    grep -v '^\[qcls\]\|^Loading weights' "$OUT/$name.log" | grep -E '^\| |^Checks|stages ms|^== |Error|error' | tail -c 2500
}
HERE=$PWD
LAT="python bench/latency.py --models qwen3_4b gemma3_4b --no-baselines --no-sdpa-ab --no-reference --iters 60"
case ${1:-latency} in
latency)
    BASE=${BASE:?set BASE to a checkout of f728a0a}
    step 190 latency-base-1 "$BASE" env QCLS_BENCH_COMMIT=f728a0a $LAT --json "$OUT/latency_base_1.json"
    step 190 latency-new "$HERE" $LAT --json "$OUT/latency_new.json"
    if [ "${REPEAT_BASE:-0}" = 1 ]; then
        step 190 latency-base-2 "$BASE" env QCLS_BENCH_COMMIT=f728a0a $LAT --json "$OUT/latency_base_2.json"
    fi
    cp "$BASE/bench/RESULTS.md" "$OUT/RESULTS_base.md" ;;
rest)
    step 100 host-qwen "$HERE" python bench/host.py --model qwen3_4b --iters 200 --profile-iters 50
    step 90 host-gemma "$HERE" python bench/host.py --model gemma3_4b --iters 100 --profile-iters 30
    step 90 paired-qkv "$HERE" python -m bench.paired --model qwen3_4b --iters 150 \
        --a "prompts=ecommerce8 engine.qkv_heads_per_program=1" --b "prompts=ecommerce8" \
        --label "q/k/v kernel: one head per program / blocked heads (request path)"
    step 90 paired-gemma "$HERE" python -m bench.paired --model gemma3_4b --iters 100 \
        --a "prompts=ecommerce8 engine.qkv_heads_per_program=1 engine.fuse_post_norms=false" --b "prompts=ecommerce8" \
        --label "Gemma3-4B: one-head q/k/v + separate post-norms / blocked q/k/v + fused post-norms (request path)"
    step 120 fidelity "$HERE" python bench/fidelity.py --model qwen3_4b --queries 8 --parts strategies ;;
gpu)
    step 560 gpu-tests "$HERE" python -m pytest -q -m gpu tests --ignore=tests/deployments \
        --ignore=tests/test_results.py -p no:cacheprovider -rfE ;;
*) echo "modes: latency | rest | gpu"; rc=1 ;;
esac
cp bench/RESULTS.md "$OUT/"
exit $rc
