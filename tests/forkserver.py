"""A fork server for the commands the slow tests run as processes (`qcls …` in the docs' run blocks, `python
bench/….py` in the benchmark smokes): one process imports what every such command imports (torch, transformers,
qcls; about 5 to 9 s of a command's start on the 2-core machine) and forks a child per command, which runs it as
`python -m qcls.cli` or `python SCRIPT` would: its own argv, working folder, environment and standard streams (the
caller's, passed over a Unix socket), its exit status returned. Nothing a command reads (tokenizer, weights,
config) is read before the fork: each child reads its own, as a fresh process does.

`Forkserver(env)` starts the server with that environment (the probe of tests/slow_marker.py included, so what a
child does is recorded as a process the test started would be); `client(tmp)` writes the two commands a test puts
first on PATH or runs: `qcls` and `python-forked` (argv as `python`'s)."""
from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

# imported once in the server: what the qcls commands and the benchmark scripts import at start
WARM = ("torch", "numpy", "transformers", "transformers.models.gemma3.modeling_gemma3",
        "transformers.models.llama.modeling_llama", "transformers.models.qwen3.modeling_qwen3", "qcls.cli.commands",
        "qcls.classifier", "qcls.config.compose", "qcls.backends", "qcls.engine", "qcls.fitting.calibrate",
        "qcls.sweep.sweep")  # never bench.common: it reads QCLS_BENCH_RESULTS when imported

CLIENT = """#!{python}
import json, os, socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect({sock!r})
request = {{"kind": {kind!r}, "argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}}
socket.send_fds(s, [json.dumps(request).encode()], [0, 1, 2])
s.shutdown(socket.SHUT_WR)
status = b""
while len(status) < 4 and (part := s.recv(4 - len(status))):
    status += part
sys.exit(struct.unpack("i", status)[0] if len(status) == 4 else 70)  # 70: the child ended without a status
"""


def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds = b"", []
    while True:
        part, got, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        fds += got
        if not part:
            return json.loads(data), fds
        data += part


def _run(kind: str, argv: list[str]) -> int:
    """In the child: the command as its own process would run it; its exit status."""
    import runpy
    try:
        if kind == "qcls":
            sys.argv = ["qcls", *argv]
            from qcls.cli.commands import main
            return main(argv) or 0
        if argv[:1] == ["-m"]:
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[0] = str(Path(argv[0]).resolve().parent)
            runpy.run_path(argv[0], run_name="__main__")
        return 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001  (a crash is the command's exit status 1, its traceback on its stderr)
        import traceback
        traceback.print_exc()
        return 1


def serve(path: str, warm: list[str]) -> None:
    import importlib
    for name in warm:
        importlib.import_module(name)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(16)
    import signal
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    sys.stdout.flush()
    sys.stderr.flush()
    while True:
        conn, _ = srv.accept()
        request, fds = _recv_request(conn)
        if os.fork() == 0:
            srv.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the command's own subprocesses are waited for
            for i, fd in enumerate(fds):
                os.dup2(fd, i)
                os.close(fd)
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            code = _run(request["kind"], request["argv"])
            sys.stdout.flush()
            sys.stderr.flush()
            conn.sendall(struct.pack("i", code))
            os._exit(code)
        for fd in fds:
            os.close(fd)
        conn.close()


class Forkserver:
    """The server as a process with environment `env`; stopped by `close()`."""

    def __init__(self, env: dict, tmp: Path, warm: tuple[str, ...] = WARM, ready_s: float = 300.0):
        self.sock = str(tmp / "forkserver.sock")
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.forkserver", self.sock, *warm], env=env,
                                     cwd=Path(__file__).resolve().parents[1], stdin=subprocess.DEVNULL)
        end = time.monotonic() + ready_s
        while not os.path.exists(self.sock):
            if self.proc.poll() is not None or time.monotonic() > end:
                self.close()
                raise RuntimeError(f"the fork server did not start (exit status {self.proc.returncode})")
            time.sleep(0.1)

    def client(self, folder: Path, kind: str) -> Path:
        """An executable that runs its argv through the server: `qcls` (kind qcls) or `python` (kind python)."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / ("qcls" if kind == "qcls" else "python-forked")
        path.write_text(CLIENT.format(python=sys.executable, sock=self.sock, kind=kind), encoding="utf-8")
        path.chmod(0o755)
        return path

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2:])
