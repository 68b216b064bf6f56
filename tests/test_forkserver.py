"""The fork server that runs the slow tests' commands (tests/forkserver.py) runs each as its own process would:
its argv, working folder, environment, standard streams and exit status."""
from __future__ import annotations

import subprocess
from pathlib import Path

from tests.forkserver import Forkserver

SCRIPT = """import os, sys
if sys.argv[1] == "crash":
    raise RuntimeError("crashed")
print("argv", sys.argv[1:], "cwd", os.path.basename(os.getcwd()), "env", os.environ.get("FORKED_TEST"))
print("stdin", sys.stdin.read().strip())
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


def test_a_forked_command_has_its_own_argv_folder_environment_streams_and_status(tmp_path: Path):
    (tmp_path / "here").mkdir()
    (tmp_path / "script.py").write_text(SCRIPT, encoding="utf-8")
    server = Forkserver({"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
                        tmp_path, warm=())
    try:
        python = server.client(tmp_path / "bin", "python")
        for code, value in ((0, "one"), (3, "two")):
            run = subprocess.run([str(python), str(tmp_path / "script.py"), str(code), "x y"], cwd=tmp_path / "here",
                                 env={"FORKED_TEST": value}, input=f"in {value}\n", capture_output=True, text=True)
            assert run.returncode == code
            assert run.stdout == f"argv ['{code}', 'x y'] cwd here env {value}\nstdin in {value}\n"
            assert run.stderr == "to stderr\n"
        crash = subprocess.run([str(python), str(tmp_path / "script.py"), "crash"], capture_output=True, text=True)
        assert crash.returncode == 1 and "RuntimeError: crashed" in crash.stderr  # as python reports an exception
    finally:
        server.close()
