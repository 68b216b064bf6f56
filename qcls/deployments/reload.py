"""Hot reload of a replica's configuration: prompts, head file, scoring and limits, on the weights it holds.

Serve hands a replica its deployment's `user_config` through `reconfigure()` at start-up and whenever it
changes (`serve deploy` with an edited user_config, `qcls reload`); its two forms, and what a reload may change, are
set out in qcls/config/reloads.py.

The new configuration's Classifier is built beside the serving one on the same loaded weights (prompts, prefix cache,
engine, graphs, warm-up): its configuration is composed in a thread, because Serve blocks the replica while
reconfigure() runs, and its build's steps (Classifier.in_steps) run on the replica's device owner (worker.py), one
between two batches: the replica keeps answering on the old configuration meanwhile. Then the worker swaps between two
batches (queries queued before the swap finish on the old one) and the result cache starts empty with the new
fingerprint. A configuration that cannot be built (a typo, labels that cannot be told apart, a head for other prompts or
that reads layers not loaded, no GPU memory left for the build) or that needs other weights or another deployment shape
is refused: the old one keeps serving and `state()` (GET /v1/prompts, `qcls reload`) says why."""
from __future__ import annotations

import gc
import logging
import os
import threading
import time
import weakref
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Generator

from qcls.backends.device_memory import free_device_memory
from qcls.config.reloads import changed_keys, target_config
from qcls.errors import QclsError, one_line

if TYPE_CHECKING:
    from qcls.classifier import Classifier

log = logging.getLogger("qcls.serve")


@dataclass
class ReloadState:
    """What a replica serves and how its last reload went: status "serving" (the last request, if any, is
    active), "building" (the new configuration is being built; the old one answers) or "refused" (`detail`
    says why; the old one answers)."""

    status: str
    fingerprint: str  # the configuration answering now
    prompts: list[str]
    request_id: str | None = None  # the last reload request (`qcls reload` sets one)
    detail: str | None = None  # why the last request was refused
    # the latest refusal ("why (at Unix time)"), kept until a new configuration serves: a request that changes
    # nothing (a roll-back to what serves) leaves it visible
    last_refusal: str | None = None
    since: float = field(default_factory=time.time)
    replica: str = field(default_factory=lambda: f"{os.uname().nodename}:{os.getpid()}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_here(steps: Generator) -> Any:
    """Every step of a build at once, in this thread (a Reloader with no device owner beside it); its value."""
    while True:
        try:
            next(steps)
        except StopIteration as end:
            return end.value


def as_steps(fn: Callable, *args) -> Generator:
    """`fn(*args)` as a build of one step, for a device owner's `run_steps`."""
    return fn(*args)
    yield  # (a generator)


class Reloader:
    """Builds requested configurations beside the active Classifier and hands each finished one to `swap`.

    `active()` returns the serving Classifier; `swap(clf)` makes a new one serve. One build at a time; a request
    that arrives during a build supersedes it (the older build is dropped when it ends)."""

    def __init__(self, active: Callable[[], "Classifier"], swap: Callable[["Classifier"], None], base: dict,
                 on_outcome: Callable[[str], None] | None = None, run_steps: Callable[[Generator], Any] = run_here):
        """`run_steps`: runs a build's steps where the device is owned (the replica's worker: between its batches)
        and returns the build's value."""
        self.active, self._swap, self.base, self.on_outcome = active, swap, base, on_outcome
        self.run_steps = run_steps
        clf = active()
        self.state = ReloadState("serving", clf.fingerprint, clf.prompt_names)
        self._generation = 0
        self._lock = threading.Lock()  # state and generation
        self._settled = threading.Condition(self._lock)  # notified whenever a request is built or refused
        self._build_lock = threading.Lock()  # one build at a time: two would need twice the memory
        self._started = False

    def live(self) -> None:
        """The replica takes traffic from now (Serve's first health check follows the start-up reconfigure()):
        every later request builds in a thread, also the first one of a replica deployed without a user_config."""
        self._started = True

    def request(self, user_config: dict | None) -> None:
        """Start building the configuration `user_config` asks for and return. A request before the replica
        takes traffic (Serve's reconfigure() right after __init__) is built here, at once: nothing waits on it."""
        first, self._started = not self._started, True
        with self._lock:
            self._generation += 1
            gen = self._generation
            rid = (user_config or {}).get("id")
            self.state = ReloadState("building", self.state.fingerprint, self.state.prompts, rid,
                                     last_refusal=self.state.last_refusal)
        if first:
            self._build(gen, user_config)
        else:
            threading.Thread(target=self._build, args=(gen, user_config), name="qcls-reload", daemon=True).start()

    def outcome(self, request_id: str, timeout_s: float) -> dict[str, Any] | None:
        """The state once this replica has built or refused the request `request_id` (the one way to wait for a
        reload: `qcls reload`, the playground's route, a handle's `reload_outcome`); None if not within
        `timeout_s` (a request that has not reached this replica yet, or one a newer request superseded)."""
        with self._settled:
            done = self._settled.wait_for(
                lambda: self.state.request_id == request_id and self.state.status != "building", timeout_s)
            return self.state.as_dict() if done else None

    def _build(self, gen: int, user_config: dict | None) -> None:
        with self._build_lock:
            if gen != self._generation:
                return  # a newer request came in while the previous build ran
            old = self.active()
            try:
                cfg = target_config(user_config, self.base, old.cfg)
                if cfg == old.cfg:
                    return self._settle(gen, "serving", old, None, changed=False)
                keys = changed_keys(old.cfg, cfg)
                if keys:
                    raise RefusedReload(f"the new configuration changes {', '.join(keys)}, which a reload cannot: "
                                        "they need other weights or another deployment shape; deploy it anew "
                                        "(stop `qcls serve` and start it with the new overrides, or change the "
                                        "app's args and `serve deploy`)")
                from qcls.classifier import Classifier
                log.warning("reload: building the new configuration beside the serving one (%d prompts: %s)",
                            len(cfg.prompts), ", ".join(p.name for p in cfg.prompts))
                new, why = self.run_steps(Classifier.in_steps(cfg, loaded=old.loaded)), None
            except BaseException as e:  # noqa: BLE001 - any failure is a refusal; the old one keeps serving
                new, why = None, one_line(e)
            if new is None:  # (out of the except clause: its traceback no longer holds the failed build's tensors)
                self.run_steps(as_steps(free_device_memory, old))
                return self._settle(gen, "refused", old, why)
            if gen != self._generation:
                return
            replaced = weakref.ref(old)
            del old
            self._swap(new)
            self._settle(gen, "serving", new, None)
            _free_when_replaced(replaced, new, self.run_steps)

    def _settle(self, gen: int, status: str, clf: "Classifier", detail: str | None, changed: bool = True) -> None:
        with self._lock:
            if gen != self._generation:
                return
            last = (f"{detail} (at {time.time():.0f})" if status == "refused"
                    else None if changed else self.state.last_refusal)
            self.state = ReloadState(status, clf.fingerprint, clf.prompt_names, self.state.request_id, detail, last)
            self._settled.notify_all()
        if not changed:
            return
        if status == "refused":
            log.warning("reload refused, still serving %s: %s", clf.fingerprint, detail)
        else:
            log.warning("reload: serving configuration %s (prompts %s)", clf.fingerprint, ", ".join(clf.prompt_names))
        if self.on_outcome is not None:
            self.on_outcome(status)


class RefusedReload(QclsError):
    """A reload that a running deployment cannot apply."""


def _free_when_replaced(replaced: "weakref.ref[Classifier]", new: "Classifier",
                        run_steps: Callable[[Generator], Any], wait_s: float = 10.0) -> None:
    """Once the queries queued on the replaced Classifier are answered, nothing holds it: give its memory (K/V
    buffers, prefix cache, graph pools) back to the device, so that the next build reuses it instead of adding
    to it (CUDA graph pools are only released by empty_cache, not handed to other allocations)."""
    t0 = time.monotonic()
    collections, collect_at = 0, t0 + 0.5
    while replaced() is not None and time.monotonic() < t0 + wait_s:
        if time.monotonic() >= collect_at:  # held by a reference cycle (an exception's traceback, say)
            _collect_unfrozen(collections == 1)
            collections, collect_at = collections + 1, collect_at + 1.0
        time.sleep(0.02)
    held = replaced()
    if held is not None:  # named by what holds it (a function's frame by the function's name), to find out why
        by = sorted({getattr(getattr(r, "f_code", None), "co_name", None) or type(r).__name__
                     for r in gc.get_referrers(held)})
        del held
        log.warning("reload: the replaced configuration is still referenced %.0f s after the swap (by %s); its "
                    "device memory is given back when it is dropped, or reused by the next build", wait_s, by)
        return
    dropped_s = time.monotonic() - t0
    freed = run_steps(as_steps(free_device_memory, new))  # (empty_cache: a device-wide synchronization)
    if freed is not None:  # (nothing cached to give back off CUDA)
        log.warning("reload: the replaced configuration was dropped %.2f s after the swap (%d garbage collections); "
                    "memory reserved by torch %.2f → %.2f GiB (allocated %.2f GiB)", dropped_s, collections, *freed)


def _collect_unfrozen(unfreeze: bool) -> None:
    """Serve freezes the garbage collector once a replica has started (RAY_SERVE_FREEZE_GC_ON_STARTUP): a cycle
    among what the start-up built, the first configuration included, is never collected after that. Once, move
    them back, collect, and freeze what is left (the request path keeps the shorter collections)."""
    frozen = unfreeze and gc.get_freeze_count() > 0
    if frozen:
        gc.unfreeze()
    gc.collect()
    if frozen:
        gc.freeze()
