"""Every thread's Python stack as text: what a replica logs when its device threads stop answering. Serve then
replaces the replica (a SIGKILL after the drain), which leaves nothing else to tell where they were stuck."""
from __future__ import annotations

import sys
import threading
import traceback


def thread_stacks() -> str:
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        out.append(f"--- thread {names.get(ident, '?')} ({ident}), innermost call last:")
        out.extend(line.rstrip("\n") for line in traceback.format_stack(frame))
    return "\n".join(out)
