"""Start-up progress on stderr with elapsed times, so result output on stdout stays clean for pipes."""
from __future__ import annotations

import logging
import sys
import time
from contextlib import contextmanager

log = logging.getLogger("qcls")
_quiet = False


def set_quiet(quiet: bool) -> None:
    global _quiet
    _quiet = quiet


@contextmanager
def step(what: str, phases: dict[str, float] | None = None, key: str | None = None):
    """Print `what …` then its elapsed time; record seconds into `phases[key]` when given."""
    t0 = time.perf_counter()
    if not _quiet:
        print(f"[qcls] {what} …", file=sys.stderr, flush=True)
    yield
    dt = time.perf_counter() - t0
    if phases is not None:
        phases[key or what] = round(dt, 3)
    if not _quiet:
        print(f"[qcls]   done in {dt:.2f}s", file=sys.stderr, flush=True)


def step_note(msg: str) -> None:
    if not _quiet:
        print(f"[qcls] {msg}", file=sys.stderr, flush=True)


def warn(msg: str) -> None:
    """One line per warning: through logging where the program configured it (a server, a test), else on
    stderr beside the progress lines; logging's last-resort handler would print it a second time, bare."""
    if _quiet or log.hasHandlers():
        log.warning(msg)
    else:
        print(f"[qcls] WARNING: {msg}", file=sys.stderr, flush=True)
