"""The tree kernels compile for a T4 (sm_75) with the shapes tuning_for gives there: within the 48 KiB of
shared memory a block gets without opting in (the T4's ceiling is 64 KiB) and without register spills. No
GPU needed: Triton compiles for a named target and ptxas (shipped with Triton) reports the resources, the
SASS shows where spilled registers are touched. The compile runs in a child process: this session's kernels
are Triton's interpreter (tests/conftest.py)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import pytest

PTR = {"q_ptr": "*fp16", "k_ptr": "*fp16", "v_ptr": "*fp16", "o_ptr": "*fp16", "part_ptr": "*fp32", "ml_ptr": "*fp32",
       "scale": "fp32", "eps": "fp32", **{f"{x}_ptr": "*fp16" for x in ("qr", "kr", "vr", "cos", "sin", "qw", "kw")}}


def _compile(fn, constexprs: dict, warps: int, stages: int) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    names = list(fn.arg_names)
    sig = {a: PTR.get(a, "*i64" if a.endswith("_ptr") else "i32") for a in names if a not in constexprs}
    # what the JIT specialises on a real launch: 16-byte aligned pointers and strides
    aligned = {(names.index(a),): [["tt.divisibility", 16]] for a in sig
               if a.endswith("_ptr") or a in ("q_s0", "q_s1", "o_s0", "kv_s_head")}
    src = ASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in constexprs}},
                    constexprs={(names.index(k),): v for k, v in constexprs.items()}, attrs=aligned)
    kernel = triton.compile(src, target=GPUTarget("cuda", 75, 32), options={"num_warps": warps, "num_stages": stages})
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True, check=True)
        sass = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True, check=True).stdout
    line = next(x for x in out.stdout.splitlines() if "REG:" in x)
    usage = dict(x.split(":") for x in line.split() if ":" in x)
    return {"shared": kernel.metadata.shared, "stack": int(usage["STACK"]), "mma": "mma" in kernel.asm["ptx"],
            "local_in_loops": local_in_loops(sass)}


def local_in_loops(sass: str) -> list[str]:
    """Local-memory instructions (register spills: STL/LDL) inside a loop of the SASS, a loop being the
    address range from a backward branch's target to the branch. A value spilled before the key loops and
    reloaded after them costs a few cached accesses per program; one inside a loop costs every step."""
    code = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    loops = [(int(t.group(1), 16), at) for at, ins in code if (t := re.search(r"\bBRA(?:\.\w+)* 0x([0-9a-f]+)", ins))
             and int(t.group(1), 16) <= at]
    return [f"{at:#x} {ins.strip()}" for at, ins in code if re.search(r"\b(STL|LDL)\b", ins)
            and any(lo <= at <= hi for lo, hi in loops)]


def resources(head_dim: int, group: int) -> dict:
    """Compile both kernels for sm_75 with tuning_for's shapes (run without TRITON_INTERPRET)."""
    import torch

    from qcls.engine import row_kernel as R
    from qcls.engine import tree_kernels as K
    from qcls.engine.tree_plan import tuning_for
    torch.cuda.get_device_capability = lambda device=None: (7, 5)
    t = tuning_for(head_dim, group, torch.device("cuda"))
    assert t.row_head_split == 1  # (the compile below assumes the whole group per program)
    out = {}
    for fused in (False, True):  # engine.fuse_qkv_attention: the q/k/v work inside (q/k norms: the most registers)
        common = dict(G=group, GP=1 << (group - 1).bit_length(), D=head_dim, WINDOW=True, FUSED=fused,
                      HAS_NORM=fused, OFFSET=False)
        name = "fused " if fused else ""
        out[name + "prefix"] = _compile(K.prefix_kernel, {**common, "BQ": t.bq, "BN": t.bn, "QB": t.qb,
                                                          "UNMASKED": t.unmasked}, t.warps, t.stages)
        out[name + "row"] = _compile(R.row_kernel, {**common, "TILE": t.row_tile, "BT": t.row_bt, "BN": t.row_bn,
                                                       "KEYS_REG": t.row_keys_in_registers, "HS": 1,
                                                       "EARLY": t.row_early_loads, "EARLY_Q": t.row_early_q,
                                                       "EARLY_KV": t.row_early_kv,
                                                       "VK": t.row_values_with_keys},
                                     t.row_warps, t.row_stages)
    return out


SHAPES = [(128, 4), (256, 4), (256, 2)]  # Qwen3-4B/8B, Gemma3 270M, 4B


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict]:
    """{"D-G": the kernels' resources, or {"error": the child's traceback}} for every shape, from one child process
    (one torch and Triton import)."""
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "tests.engine.test_tree_compile",
                           *(f"{d}-{g}" for d, g in SHAPES)], env=env,
                          capture_output=True, text=True, cwd=Path(__file__).parents[2], timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("head_dim,group", SHAPES)
def test_turing_shapes_compile_without_spills(head_dim, group, compiled):
    got = compiled[f"{head_dim}-{group}"]
    if "error" in got:
        if "ptxas" in got["error"] or "cuobjdump" in got["error"]:
            pytest.skip(f"cannot compile for sm_75 here: {got['error'].strip().splitlines()[-1]}")
        raise AssertionError(got["error"][-3000:])
    for name, r in got.items():
        assert r["shared"] <= 48 * 1024, (name, r)
        assert not r["mma"], (name, r)  # sm_75: FMA dots, as the tuning assumes
        # no register spill inside a loop; the few bytes sm_75 spills around the loops of the d=256 row kernel
        # (255 registers in use) stay few
        assert not r["local_in_loops"] and r["stack"] <= 32, (name, r)


def test_spills_are_found_inside_loops_only():
    sass = """
        /*0000*/                   STL [R1], R68 ;                  /* 0x0 */
        /*0010*/                   HMMA.1688.F32 R4, R8, R12, R4 ;  /* 0x0 */
        /*0020*/                   LDL R9, [R1+0x4] ;               /* 0x0 */
        /*0030*/               @P5 BRA 0x10 ;                       /* 0x0 */
        /*0040*/                   LDL.LU R68, [R1] ;               /* 0x0 */
        /*0050*/                   BRA 0x60 ;                       /* 0x0 */
        /*0060*/                   EXIT ;                           /* 0x0 */
    """
    assert local_in_loops(sass) == ["0x20 LDL R9, [R1+0x4]"]  # 0x10-0x30 is a loop; 0x00, 0x40 are outside


def _resources_each(shapes: list[str]) -> dict[str, dict]:
    out = {}
    for shape in shapes:
        try:
            out[shape] = resources(*map(int, shape.split("-")))
        except Exception:  # noqa: BLE001 - reported to the shape's own test
            out[shape] = {"error": traceback.format_exc()}
    return out


if __name__ == "__main__":
    print(json.dumps(_resources_each(sys.argv[1:])))
