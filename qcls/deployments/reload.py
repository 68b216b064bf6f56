"""A replica's hot reloads: the requests and their outcome (`Reloader`, `ReloadState`), and the records of the device
work the worker does for one (`Build`, `Release`). Serve hands a replica its deployment's `user_config` through
`reconfigure()` at start-up and whenever it changes (`serve deploy`, `qcls reload`; its forms and what a reload may
change: qcls/config/reloads.py). The Reloader composes the configuration in a thread (Serve blocks the replica while
reconfigure() runs) and hands it to `EngineWorker.reload`: built beside the serving one, swapped in, the old one's
memory given back. A configuration that cannot be built or that needs other weights or another deployment shape is
refused: the old one keeps serving and `state` (GET /v1/prompts, `qcls reload`) says why."""
from __future__ import annotations

import gc
import logging
import os
import threading
import time
import weakref
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Generator

from qcls.backends.device_memory import free_device_memory
from qcls.config.reloads import changed_keys, target_config
from qcls.errors import QclsError, one_line

if TYPE_CHECKING:
    from qcls.classifier import Classifier
    from qcls.deployments.metrics import ReplicaMetrics
    from qcls.deployments.worker import EngineWorker

log = logging.getLogger("qcls.serve")

# A replaced configuration still held this long after the swap is logged with what holds it (and no longer waited for)
RELEASE_WAIT_S = 10.0


@dataclass
class ReloadState:
    """What a replica serves and how its last reload went: status "serving" (the last request, if any, is active),
    "building" (the new configuration is being built; the old one answers) or "refused" (`detail` says why; the old one
    answers)."""

    status: str
    fingerprint: str  # the configuration answering now
    prompts: list[str]
    request_id: str | None = None  # the last reload request (`qcls reload` sets one)
    detail: str | None = None  # why the last request was refused
    # the latest refusal ("why (at Unix time)"), kept until a new configuration serves: a request that changes nothing
    # (a roll-back to what serves) leaves it visible
    last_refusal: str | None = None
    since: float = field(default_factory=time.time)
    replica: str = field(default_factory=lambda: f"{os.uname().nodename}:{os.getpid()}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Reloader:
    """A replica's reload requests, in order: each one's configuration, composed in a thread, goes to the worker; a
    request that arrives during a build supersedes it. `state` is how the last one went."""

    def __init__(self, worker: EngineWorker, base: dict, metrics: ReplicaMetrics | None = None):
        """`base`: the app's own {"overrides", "config_dir"}, under a user_config's overrides."""
        self.worker, self.base, self.metrics = worker, base, metrics
        clf = worker.clf
        self.state = ReloadState("serving", clf.fingerprint, clf.prompt_names)
        self._generation = 0
        self._lock = threading.Lock()  # state and generation
        self._settled = threading.Condition(self._lock)  # notified whenever a request is built or refused
        self._compose = threading.Lock()  # one configuration composed at a time (Hydra's state is global)
        self._started = False

    def live(self) -> None:
        """The replica takes traffic from now (Serve's first health check follows the start-up reconfigure()): every
        later request is composed in a thread, also the first one of a replica deployed without a user_config."""
        self._started = True

    def request(self, user_config: dict | None) -> None:
        """Start applying the configuration `user_config` asks for and return. A request before the replica takes
        traffic (Serve's reconfigure() right after __init__) is applied here, at once: nothing waits on it."""
        first, self._started = not self._started, True
        with self._lock:
            self._generation += 1
            gen = self._generation
            rid = (user_config or {}).get("id")
            self.state = ReloadState("building", self.state.fingerprint, self.state.prompts, rid,
                                     last_refusal=self.state.last_refusal)
        if first:
            self._apply(gen, user_config)
        else:
            threading.Thread(target=self._apply, args=(gen, user_config), name="qcls-reload", daemon=True).start()

    def outcome(self, request_id: str, timeout_s: float) -> dict[str, Any] | None:
        """The state once this replica has built or refused the request `request_id` (the one way to wait for a reload:
        `qcls reload`, the playground's route, a handle's `reload_outcome`); None if not within `timeout_s` (a request
        that has not reached this replica yet, or one a newer request superseded)."""
        with self._settled:
            done = self._settled.wait_for(
                lambda: self.state.request_id == request_id and self.state.status != "building", timeout_s)
            return self.state.as_dict() if done else None

    def _apply(self, gen: int, user_config: dict | None) -> None:
        old = self.worker.clf
        try:
            with self._compose:
                if gen != self._generation:
                    return  # a newer request came in meanwhile
                cfg = target_config(user_config, self.base, old.cfg)
            keys = changed_keys(old.cfg, cfg)
            if keys:
                raise RefusedReload(f"the new configuration changes {', '.join(keys)}, which a reload cannot: they "
                                    "need other weights or another deployment shape; deploy it anew (stop `qcls serve` "
                                    "and start it with the new overrides, or change the app's args and `serve deploy`)")
            if cfg != old.cfg:
                log.warning("reload: building the new configuration beside the serving one (%d prompts: %s)",
                            len(cfg.prompts), ", ".join(p.name for p in cfg.prompts))
            with self._lock:  # handed over in the order requested
                if gen != self._generation:
                    return
                serving = self.worker.reload(cfg)
            new = serving.result()
        except BaseException as e:  # noqa: BLE001 - any failure is a refusal; the old one keeps serving
            return self._settle(gen, "refused", self.worker.clf, one_line(e))
        self._settle(gen, "serving", new, None, changed=new is not old)

    def _settle(self, gen: int, status: str, clf: Classifier, detail: str | None, changed: bool = True) -> None:
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
        if self.metrics is not None:
            self.metrics.reload_outcome(status)
            if status == "serving":
                self.metrics.cache_size(0)  # the new configuration's result cache starts empty


class RefusedReload(QclsError):
    """A reload that a running deployment cannot apply."""


class Superseded(RuntimeError):
    """A reload's build that a later reload replaced before it ended."""


@dataclass
class Build:
    """A reload's build as the worker runs it: its steps (Classifier.in_steps), the future its caller waits on, and
    (seconds, what) per step run."""

    steps: Generator
    done: Future
    took: list[tuple[float, str]] = field(default_factory=list)
    superseded: bool = False

    def turn(self, slice_s: float) -> tuple[Classifier | None, BaseException | None]:
        """The next step, and more while the turn is shorter than `slice_s`: (the Classifier, None) once built; (None,
        why) once failed or superseded, the error without its frames (they hold what the build allocated, which goes
        back to the device); (None, None) while it goes on."""
        turn = time.monotonic()
        while not self.superseded:
            t0 = time.perf_counter()
            try:
                name = next(self.steps)
            except StopIteration as stop:
                self._ended(t0, "the last step")
                if self.superseded:  # while its last step ran: what it built is dropped
                    break
                return stop.value, None
            except BaseException as e:  # noqa: BLE001 - handed to the reload's caller
                self._ended(t0, "a failed step")
                return None, without_frames(e)
            self.took.append((time.perf_counter() - t0, name))
            if time.monotonic() - turn >= slice_s:
                return None, None
        self.steps.close()
        return None, Superseded("a later reload superseded this one before its build ended")

    def _ended(self, t0: float, name: str) -> None:
        self.took.append((time.perf_counter() - t0, name))
        top = sorted(self.took, key=lambda t: -t[0])[:3]
        # a graph capture is the one step that cannot be cut finer: the floor of what a step costs the queries
        capture = max((t for t in self.took if str(t[1]).endswith("graph captured")), key=lambda t: t[0], default=None)
        log.warning("device owner: a build of %d steps, %.2f s on the device; its longest step %.1f ms (%s); then %s%s",
                    len(self.took), sum(t for t, _ in self.took), top[0][0] * 1e3, top[0][1],
                    ", ".join(f"{t * 1e3:.1f} ms ({name})" for t, name in top[1:]) or "none",
                    f"; its longest graph capture {capture[0] * 1e3:.1f} ms ({capture[1]})" if capture else "")


@dataclass(eq=False)
class Release:
    """Device memory the worker gives back (free_device_memory: empty_cache, so that the next build reuses it instead
    of adding to it): a replaced configuration's once nothing holds it (`held`: its finalizer), or what a failed build
    left (`held` None), at once. One held by a reference cycle gets a garbage collection at 0.5 s and one with the
    objects Serve froze at 1.5 s; one still held at RELEASE_WAIT_S is logged with what holds it and no longer waited
    for (its memory goes back when it is dropped, or is reused by the next build)."""

    held: weakref.finalize | None
    since: float = field(default_factory=time.monotonic)
    collect_at: float = 0.0
    collections: int = 0

    def __post_init__(self):
        self.collect_at = self.since + 0.5
        if self.held is not None:
            self.held.atexit = False

    @property
    def dropped(self) -> bool:
        return self.held is None or not self.held.alive

    def collect(self) -> bool:
        """The next garbage collection; False once given up on."""
        if self.dropped:
            return True  # (the worker gives its memory back next)
        if self.collections < 2:
            collect_unfrozen(unfreeze=self.collections == 1)
            self.collections += 1
            self.collect_at = self.since + (1.5 if self.collections == 1 else RELEASE_WAIT_S)
            return True
        held = self.held.peek()  # (the object, the callback, its arguments), None once dropped
        if held is None:
            return True
        # named by what holds it (a function's frame by the function's name), to find out why
        by = sorted({getattr(getattr(r, "f_code", None), "co_name", None) or type(r).__name__
                     for r in gc.get_referrers(held[0])})
        log.warning("reload: the replaced configuration is still referenced %.0f s after the swap (by %s); its device "
                    "memory is given back when it is dropped, or reused by the next build", RELEASE_WAIT_S, by)
        return False


def give_back(dropped: list[Release], clf: Classifier) -> None:
    """What the dropped configurations held goes back to the device (empty_cache: a device-wide synchronization, so the
    worker runs this alone on the device)."""
    try:
        freed = free_device_memory(clf)
    except Exception:  # noqa: BLE001 - the memory stays cached (reused by the next build); the replica serves on
        log.exception("reload: giving the replaced configuration's memory back failed")
        return
    for r in dropped:
        if r.held is not None and freed is not None:  # (nothing cached to give back off CUDA)
            log.warning("reload: the replaced configuration was dropped %.2f s after the swap (%d garbage "
                        "collections); memory reserved by torch %.2f → %.2f GiB (allocated %.2f GiB)",
                        time.monotonic() - r.since, r.collections, *freed)


def without_frames(error: BaseException) -> BaseException:
    """`error`, and the errors it chains, without their tracebacks: their frames hold what a failed build allocated."""
    todo, seen = [error], set()
    while todo:
        e = todo.pop()
        if e is not None and id(e) not in seen:
            seen.add(id(e))
            e.__traceback__ = None
            todo += [e.__cause__, e.__context__]
    return error


def collect_unfrozen(unfreeze: bool) -> None:
    """Serve freezes the garbage collector once a replica has started (RAY_SERVE_FREEZE_GC_ON_STARTUP): a cycle among
    what the start-up built, the first configuration included, is never collected after that. `unfreeze`: move them
    back, collect, and freeze what is left (the request path keeps the shorter collections)."""
    frozen = unfreeze and gc.get_freeze_count() > 0
    if frozen:
        gc.unfreeze()
    gc.collect()
    if frozen:
        gc.freeze()
