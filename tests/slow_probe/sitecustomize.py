"""Records, for the test suite's `slow` marker, what a test process or any Python process it starts does that
makes a test slow: reading a demo model's weights (qcls's `qcls.load_model` audit event on a path outside the
temporary folders, where the tiny random-weight models live) or starting a Ray cluster (a `gcs_server` process).

tests/conftest.py installs it in the test process and puts this folder first on PYTHONPATH, so that Python
processes started by a test run it too as `sitecustomize`; each appends one line per event to the file named by
QCLS_TEST_PROBE. Ray's own worker processes are left out: what a served replica loads belongs to the test that
deployed it, which the fixtures already account for."""
from __future__ import annotations

import os
import sys
import tempfile


def _is_demo(path: str) -> bool:
    real = os.path.realpath(path)
    return not real.startswith((os.path.realpath(tempfile.gettempdir()) + os.sep, "/tmp/"))


def _in_ray_worker() -> bool:
    return any("ray" + os.sep + "_private" in (a or "") for a in sys.argv[:1])


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
    sys.addaudithook(hook)


if os.environ.get("QCLS_TEST_PROBE"):
    install(os.environ["QCLS_TEST_PROBE"])
