"""The `qcls` command: `main` (`commands`) reads the command line and runs the Classifier's own commands (classify,
repl, check, bulk) or hands the others to their modules: `serve` (`qcls serve`: the Ray Serve app), `reload`
(`qcls reload`: a running app's new configuration), `label_next` (`qcls label-next`); sweep, calibrate and audit live
with what they run (qcls/sweep/sweep.py, qcls/fitting/)."""
from qcls.cli.commands import main

__all__ = ["main"]
