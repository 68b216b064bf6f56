#!/usr/bin/env bash
# Issue 9's GPU run in one go (the device machine: wheels carried in .whl_eval, see docs/evaluation.md):
#   1. a random-weight Qwen3-4B checkpoint of real shape with the real Qwen tokenizer (bench/backends.py);
#   2. `qcls sweep` over backend=fp16,fp16-offload,bnb-int8,bnb-nf4 × scoring=trie,first_token ×
#      prompts=default,ecommerce8 under the T4 memory budget (gpu=t4): latency and GPU memory per job (accuracy
#      on random weights means nothing; first_token refuses ecommerce8's colliding Chinese labels, a result too);
#   3. bench/paired.py: calibration on/off and zero-/few-shot, timed in alternation;
#   4. the GPU tests of the calibrated tail.
# Everything is appended to bench/RESULTS.md; with $OUT set, RESULTS.md, the sweep's summary and plots and a
# tarball of the job folders are copied there.
#     QCLS_BENCH_COMMIT=<sha> bash bench/eval_gpu.sh [CKPT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
CKPT=${1:-/tmp/qcls_random_qwen3_4b}
SWEEP=${SWEEP_DIR:-/tmp/qcls_gpu_sweep}
export PYTHONUNBUFFERED=1
rc=0
python -c "from pathlib import Path; from bench.backends import write_checkpoint
write_checkpoint(Path('$CKPT'), 'qwen3_4b', 'cuda')" || exit 1
rm -rf "$SWEEP"
python -m qcls.eval.sweep -m model=qwen3_4b model.name=random_qwen3_4b model.source=local "model.path=$CKPT" \
    backend=fp16,fp16-offload,bnb-int8,bnb-nf4 scoring=trie,first_token prompts=default,ecommerce8 eval=dev gpu=t4 \
    "hydra.sweep.dir=$SWEEP" || rc=1
python - "$SWEEP" <<'EOF' || rc=1
import sys
from pathlib import Path
from bench import common as C
summary = (Path(sys.argv[1]) / "summary.md").read_text()
lines = [x for x in summary.splitlines()[1:] if not x.startswith("![") and x != "## Plots"]
body = "\n".join(lines).replace("\n## ", "\n#### ") + "\n"
C.append(C.header("qcls sweep on random-weight Qwen3-4B (issue 9)", "model=qwen3_4b (random weights, real "
                  "Qwen tokenizer) eval=dev gpu=t4; backend × scoring × prompts (default, ecommerce8)") + body)
EOF
python -m bench.paired --model qwen3_4b --a prompts=ecommerce8 --b "prompts=ecommerce8 calibration=random" \
    --label "calibration off / on (request path)" || rc=1
python -m bench.paired --model qwen3_4b --a prompts=ecommerce8 --b prompts=ecommerce8_fewshot \
    --label "zero-shot / few-shot prompts (request path)" || rc=1
python -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_calibration_engine.py tests/engine/test_gpu.py || rc=1
if [ -n "${OUT:-}" ]; then
    cp bench/RESULTS.md "$OUT/"
    cp "$SWEEP"/summary.md "$SWEEP"/summary.csv "$SWEEP"/*.png "$OUT/" 2>/dev/null
    tar -czf "$OUT/sweep_jobs.tgz" -C "$SWEEP" . 2>/dev/null
fi
exit $rc
