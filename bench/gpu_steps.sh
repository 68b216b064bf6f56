# Sourced by the bench/*_gpu.sh scripts: `source bench/gpu_steps.sh NAME [TAIL_BYTES]` sets OUT (default
# /tmp/qcls_NAME; what a device command leaves there comes back), the environment, rc, prints the GPU, and
# defines `step SECONDS NAME COMMAND...`: run with a time limit, keep its log in $OUT, show its tail without
# qcls's progress lines. A failed or timed-out step sets rc=1 and the next step still runs. `pack_out` (last) packs
# $OUT's logs and JSON into logs.tgz beside RESULTS*.md and *_ab.md: the device tool returns at most 8 files.
OUT=${OUT:-/tmp/qcls_$1}
STEP_TAIL=${2:-3000}
mkdir -p "$OUT"
export OUT PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
rc=0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
step() {
    local limit=$1 name=$2
    shift 2
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1 || { echo "== $name failed or ran out of time ($limit s)"; rc=1; }
    echo "== $name"
    grep -v '^\[qcls\]' "$OUT/$name.log" | grep -v "^Loading weights" | tail -c "$STEP_TAIL"
}
pack_out() {
    local list
    list=$(cd "$OUT" && ls | grep -v -e '^RESULTS' -e '_ab\.md$' -e '^logs\.tgz$')
    [ -n "$list" ] && (cd "$OUT" && tar -czf logs.tgz $list && rm -f $list)
}
