"""The Hydra callback that writes the sweep report when a multirun (or a single `qcls sweep` run) ends."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class SweepReport(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        write_report(Path(str(config.hydra.sweep.dir)))

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        write_report(Path(str(config.hydra.run.dir)))


def write_report(sweep_dir: Path) -> dict[str, Any]:
    from qcls.sweep.report import build
    out = build([sweep_dir])
    failed = [x for x in out["rows"] if x["status"] != "ok"]
    lines = [f"[qcls] sweep done: {out['jobs']} jobs, {len(failed)} failed; report: {sweep_dir / 'summary.md'}"]
    lines += [f"[qcls]   failed {x['job']} ({x['label']}): {x['reason']}" for x in failed]
    print("\n".join(lines), file=sys.stderr, flush=True)
    return out
