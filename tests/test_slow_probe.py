"""The probe behind the `slow` marker (tests/slow_probe/sitecustomize.py) recognises what makes a test slow."""
from __future__ import annotations

import sys

from tests.slow_probe.sitecustomize import _bench_script


def test_a_benchmark_script_is_recognised_in_the_argv_of_a_process():
    assert _bench_script([sys.executable, "bench/host.py", "--model", "tiny"]) == "bench/host.py"
    assert _bench_script(["python", "/repo/bench/load.py"]) == "/repo/bench/load.py"
    assert _bench_script(["python", "-m", "bench.backends", "--tiny"]) == "bench.backends"
    assert _bench_script(["python", "-m", "qcls", "bulk", "bench/log.csv"]) is None
    assert _bench_script(["python", "-m", "pytest", "tests/bench/test_smoke.py"]) is None
