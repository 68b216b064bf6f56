"""The decoder's elementwise kernels compile for a T4 (sm_75) and for Hopper (sm_90) in fp16, with the
dtypes the engine passes (float32 residual stream, float16 activations). Triton's interpreter (the CPU test
runs) executes a kernel's Python directly and misses what only the compiler rejects. No GPU needed: Triton
compiles for a named target; the compile runs in a child process without TRITON_INTERPRET, one per arch.
sm_75, the target card, which no machine here has, is compiled in every run; sm_80 and sm_90 with the GPU tests
(`pytest -m gpu`): about a hundred compiles and ptxas runs are minutes of a 2-core machine's suite, seconds of a
GPU host's, and the GPU tests run the sm_90 kernels besides."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

NORM = {"x_ptr": "*fp16", "r_ptr": "*fp32", "w_ptr": "*fp16", "y_ptr": "*fp16", "s_ptr": "*fp32", "rows_ptr": "*i64",
        "qs_ptr": "*fp32", "m_ptr": "*fp32", "xs_ptr": "*fp32", "ws_ptr": "*fp32", "H": "i32", "eps": "fp32",
        "scale": "fp32"}
QKV = {"q_ptr": "*fp16", "k_ptr": "*fp16", "v_ptr": "*fp16", "cos_ptr": "*fp16", "sin_ptr": "*fp16", "qw_ptr": "*fp16",
       "kw_ptr": "*fp16", "qo_ptr": "*fp16", "kb_ptr": "*fp16", "vb_ptr": "*fp16", "slot_ptr": "*i64", "q_s0": "i32",
       "k_s0": "i32", "v_s0": "i32", "qo_s0": "i32", "kb_s_head": "i32", "eps": "fp32"}
POST = {"x_ptr": "*fp16", "r_ptr": "*fp32", "wp_ptr": "*fp16", "w_ptr": "*fp16", "y_ptr": "*fp16", "s_ptr": "*fp32",
        "rows_ptr": "*i64", "qs_ptr": "*fp32", "m_ptr": "*fp32", "xs_ptr": "*fp32", "ws_ptr": "*fp32", "H": "i32",
        "eps_post": "fp32", "eps": "fp32"}
ACT = {"g_ptr": "*fp16", "u_ptr": "*fp16", "out_ptr": "*fp16", "qs_ptr": "*fp32", "m_ptr": "*fp32", "xs_ptr": "*fp32",
       "wg_ptr": "*fp32", "wu_ptr": "*fp32", "I": "i32", "g_s0": "i32", "u_s0": "i32"}
FP = {"INT8": False, "SMOOTH": False, "DEQ": False}  # the floating-point output
Q8 = {"INT8": True, "SMOOTH": True, "DEQ": False}  # quantized for a W8A8 GEMM (backend=int8)
DQ = {"INT8": True, "SMOOTH": True, "DEQ": True}  # ... reading a W8A8 GEMM's int32 product and its scales
QUANT = {"x_ptr": "*fp16", "q_ptr": "*i8", "qs_ptr": "*fp32", "m_ptr": "*fp32", "K": "i32", "x_s0": "i32"}
DEQUANT = {"acc_ptr": "*i32", "xs_ptr": "*fp32", "ws_ptr": "*fp32", "b_ptr": "*fp32", "out_ptr": "*fp16", "N": "i32"}
GROUP = {"logits_ptr": "*fp32", "flat_ptr": "*i64", "members_ptr": "*i64", "out_ptr": "*fp32", "E": "i32"}
SOFTMAX = {"x_ptr": "*fp32", "idx_ptr": "*i64", "out_ptr": "*fp64", "S": "i32", "N2": "i32"}
# (kernel, argument types, constexprs): what decoder.py launches for Qwen3-4B and Gemma3-4B in fp16; the final
# norm writes float32 states
CASES = [
    ("_add_rmsnorm_kernel", NORM, {**FP, "HAS_RES": True, "OFFSET": False, "GATHER": False, "SCALE": False, "BLOCK": 4096,
                                   "HINT": False}),
    ("_add_rmsnorm_kernel", {**NORM, "y_ptr": "*fp32"}, {**FP, "HAS_RES": True, "OFFSET": False, "GATHER": False,
                                                         "SCALE": False, "BLOCK": 4096, "HINT": False}),
    # the first layer's norm: the embedding table's rows gathered (and scaled: Gemma3)
    ("_add_rmsnorm_kernel", NORM, {**FP, "HAS_RES": False, "OFFSET": True, "GATHER": True, "SCALE": True, "BLOCK": 4096,
                                   "HINT": False}),
    ("_add_rmsnorm_kernel", NORM, {**FP, "HAS_RES": False, "OFFSET": False, "GATHER": True, "SCALE": False, "BLOCK": 4096,
                                   "HINT": False}),
    ("_add_rmsnorm_kernel", NORM, {**FP, "HAS_RES": True, "OFFSET": False, "GATHER": True, "SCALE": False,
                                   "BLOCK": 4096, "HINT": False}),  # last layer
    ("_qkv_kernel", QKV, {"NH": 32, "D": 128, "HAS_NORM": True, "OFFSET": False}),
    ("_qkv_kernel", QKV, {"NH": 8, "D": 256, "HAS_NORM": True, "OFFSET": True}),
    ("_qkv_heads_kernel", QKV, {"NH": 32, "D": 128, "HB": 8, "HAS_NORM": True, "OFFSET": False}),
    ("_qkv_heads_kernel", QKV, {"NH": 8, "D": 256, "HB": 4, "HAS_NORM": True, "OFFSET": True}),
    ("_post_add_rmsnorm_kernel", POST, {**FP, "OFFSET": True, "GATHER": False, "BLOCK": 4096, "HINT": False}),
    ("_post_add_rmsnorm_kernel", POST, {**FP, "OFFSET": True, "GATHER": True, "BLOCK": 4096, "HINT": False}),
    ("_post_add_rmsnorm_kernel", {**POST, "y_ptr": "*fp32"}, {**FP, "OFFSET": True, "GATHER": False, "BLOCK": 4096,
                                                              "HINT": False}),
    # the norms' L2 eviction hints (kernels.residual_hints: sm_80+ only; compiled for sm_75 too)
    ("_add_rmsnorm_kernel", NORM, {**FP, "HAS_RES": True, "OFFSET": False, "GATHER": False, "SCALE": False, "BLOCK": 4096,
                                   "HINT": True}),
    ("_add_rmsnorm_kernel", NORM, {**FP, "HAS_RES": False, "OFFSET": True, "GATHER": True, "SCALE": True, "BLOCK": 4096,
                                   "HINT": True}),
    ("_post_add_rmsnorm_kernel", POST, {**FP, "OFFSET": True, "GATHER": False, "BLOCK": 4096, "HINT": True}),
    ("_act_mul_kernel", ACT, {**FP, "GELU": False, "BLOCK": 1024}),
    ("_act_mul_kernel", ACT, {**FP, "GELU": True, "BLOCK": 1024}),
    # backend=int8: the norms and the activation hand the GEMM int8 rows (Qwen3-8B's intermediate size: one program a row)
    ("_add_rmsnorm_kernel", {**NORM, "y_ptr": "*i8"}, {**Q8, "HAS_RES": True, "OFFSET": False, "GATHER": False,
                                                      "SCALE": False, "BLOCK": 4096, "HINT": False}),
    ("_add_rmsnorm_kernel", {**NORM, "y_ptr": "*i8"}, {**Q8, "HAS_RES": False, "OFFSET": True, "GATHER": True,
                                                      "SCALE": True, "BLOCK": 4096, "HINT": True}),
    ("_post_add_rmsnorm_kernel", {**POST, "y_ptr": "*i8"}, {**Q8, "OFFSET": True, "GATHER": False, "BLOCK": 4096,
                                                           "HINT": False}),
    ("_act_mul_kernel", {**ACT, "out_ptr": "*i8"}, {**Q8, "GELU": False, "BLOCK": 16384}),
    ("_act_mul_kernel", {**ACT, "out_ptr": "*i8"}, {**Q8, "GELU": True, "BLOCK": 16384}),
    # backend=int8: the o/down projections' and gate/up's int32 products read with their scales by the next kernel
    ("_add_rmsnorm_kernel", {**NORM, "x_ptr": "*i32", "y_ptr": "*i8"}, {**DQ, "HAS_RES": True, "OFFSET": False,
                                                                        "GATHER": False, "SCALE": False, "BLOCK": 4096,
                                                                        "HINT": True}),
    ("_add_rmsnorm_kernel", {**NORM, "x_ptr": "*i32", "y_ptr": "*fp32"}, {**DQ, "INT8": False, "SMOOTH": False,
                                                                          "HAS_RES": True, "OFFSET": False, "GATHER": True,
                                                                          "SCALE": False, "BLOCK": 4096, "HINT": False}),
    ("_post_add_rmsnorm_kernel", {**POST, "x_ptr": "*i32", "y_ptr": "*i8"}, {**DQ, "OFFSET": True, "GATHER": False,
                                                                             "BLOCK": 4096, "HINT": False}),
    ("_act_mul_kernel", {**ACT, "g_ptr": "*i32", "u_ptr": "*i32", "out_ptr": "*i8"}, {**DQ, "GELU": False,
                                                                                     "BLOCK": 16384}),
    ("_act_mul_kernel", {**ACT, "g_ptr": "*i32", "u_ptr": "*i32", "out_ptr": "*i8"}, {**DQ, "GELU": True,
                                                                                     "BLOCK": 16384}),
    ("_quantize_rows_kernel", QUANT, {"SMOOTH": True, "BLOCK": 4096}),
    ("_dequantize_kernel", DEQUANT, {"HAS_BIAS": False, "BLOCK": 1024}),
    ("_group_scores_kernel", GROUP, {"W": 10, "BE": 128, "BW": 16}),  # the tail (engine.fuse_tail)
    ("_softmax_kernel", SOFTMAX, {"L": 10, "BS": 32, "BL": 16}),  # the probabilities (engine/probs.py)
    # the RoPE tables' rows (Gemma3: two kinds' cos and sin)
    ("_gather_rows_kernel", {"t_ptr": "*fp16", "idx_ptr": "*i64", "out_ptr": "*fp16", "P": "i32", "N": "i32"},
     {"D": 256, "K": 4, "BLOCK": 256}),
]


def compile_all(arch: int) -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from qcls.engine import act_kernels as A
    from qcls.engine import int8_kernels as I8
    from qcls.engine import kernels as K
    from qcls.engine import probs as P
    from qcls.engine import qkv_kernels as Q
    from qcls.engine import tail as T
    for name, sig, consts in CASES:
        fn = next(getattr(m, name) for m in (K, A, Q, T, P, I8) if hasattr(m, name))
        names = list(fn.arg_names)
        src = ASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in consts}},
                        constexprs={(names.index(k),): v for k, v in consts.items()})
        triton.compile(src, target=GPUTarget("cuda", arch, 32))


ARCHS = (75, 80, 90)
ON_GPU_MACHINES = (80, 90)


@pytest.fixture(scope="module")
def compiled():
    """arch → "" or the error of compiling every case for it, in a child process of its own (Triton's compiler
    is not imported into the test process), each arch once."""
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done: dict[int, str] = {}

    def get(arch: int) -> str:
        if arch not in done:
            proc = subprocess.run([sys.executable, "-m", "tests.engine.test_kernels_compile", str(arch)], env=env,
                                  capture_output=True, text=True, cwd=Path(__file__).parents[2], timeout=900)
            assert proc.returncode == 0, proc.stderr[-3000:]
            done[arch] = json.loads(proc.stdout.strip().splitlines()[-1])[str(arch)]
        return done[arch]
    return get


@pytest.mark.parametrize("arch", [pytest.param(a, marks=pytest.mark.gpu) if a in ON_GPU_MACHINES else a
                                  for a in ARCHS])
def test_elementwise_kernels_compile(arch, compiled):
    error = compiled(arch)
    if "ptxas" in error or "No such file" in error:
        pytest.skip(f"cannot compile for sm_{arch} here: {error.strip().splitlines()[-1]}")
    assert not error, error[-3000:]


def _compile_each(archs: list[int]) -> dict[str, str]:
    out = {}
    for arch in archs:
        try:
            compile_all(arch)
            out[str(arch)] = ""
        except Exception:  # noqa: BLE001 - reported to the arch's own test
            out[str(arch)] = traceback.format_exc()
    return out


if __name__ == "__main__":
    print(json.dumps(_compile_each([int(a) for a in sys.argv[1:]])))
