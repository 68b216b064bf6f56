"""Records, for the test suite's `slow` marker, what a test process or any Python process it starts does that
makes a test slow: reading a demo model's weights (qcls's `qcls.load_model` audit event on a path outside the
temporary folders, where the tiny random-weight models live), starting a Ray cluster (a `gcs_server` process) or
running a benchmark script (`python bench/NAME.py`, `python -m bench.NAME`: each builds and runs a model in a process
of its own).

tests/conftest.py installs it in the test process and puts this folder first on PYTHONPATH, so that Python
processes started by a test run it too as `sitecustomize`; each appends one line per event to the file named by
QCLS_TEST_PROBE. Ray's own worker processes are left out: what a served replica loads belongs to the test that
deployed it, which the fixtures already account for."""
from __future__ import annotations

import os
import re
import sys
import tempfile


def _is_demo(path: str) -> bool:
    real = os.path.realpath(path)
    return not real.startswith((os.path.realpath(tempfile.gettempdir()) + os.sep, "/tmp/"))


def _in_ray_worker() -> bool:
    return any("ray" + os.sep + "_private" in (a or "") for a in sys.argv[:1])


def _bench_script(argv) -> str | None:
    """The benchmark script a process's argv runs, if it runs one."""
    argv = [os.fspath(a) for a in argv] if isinstance(argv, (list, tuple)) else [os.fspath(argv)]
    for i, a in enumerate(argv):
        if re.search(r"(^|/)bench/\w+\.py$", a) and not re.search(r"(^|/)tests/bench/", a):
            return a
        if a == "-m" and i + 1 < len(argv) and argv[i + 1].startswith("bench."):
            return argv[i + 1]
    return None


def _record(probe: str, line: str) -> None:
    if _in_ray_worker():
        return
    fd = os.open(probe, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line.replace("\n", " ") + "\n").encode())
    finally:
        os.close(fd)


def install(probe: str) -> None:
    def hook(event: str, args: tuple) -> None:
        if event == "qcls.load_model" and _is_demo(str(args[0])):
            _record(probe, f"loads the demo model {args[0]}")
        elif event == "subprocess.Popen" and "gcs_server" in str(args[1]):
            _record(probe, "starts a Ray cluster")
        elif event == "subprocess.Popen" and (script := _bench_script(args[1])):
            _record(probe, f"runs the benchmark script {script}")
    sys.addaudithook(hook)


if os.environ.get("QCLS_TEST_PROBE"):
    install(os.environ["QCLS_TEST_PROBE"])
