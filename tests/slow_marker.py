"""The `slow` marker means what it says, and the slow tests share workers as their resources require.

`slow` = the test reads a demo model's weights, starts Ray, or starts a process that does, runs a benchmark script
(each builds and runs a model in a process of its own: bench/README.md's smoke runs), or runs the tree-attention
kernels in Triton's interpreter (on a CPU each launch runs every program in Python: those tests are most of the
rest's time) — directly, or through a fixture that does. tests/slow_probe/sitecustomize.py records
those events, in this process and in every Python process a test starts; a fixture that caused one is remembered,
and a test that caused one or uses such a fixture without the marker fails with what it did. The edit loop
`python -m pytest -q -m "not slow and not gpu"` therefore never loads a demo model, starts Ray, runs a benchmark
or interprets the tree-attention kernels (the small elementwise kernels still run there in the interpreter).

Groups for pytest-xdist (`--dist loadgroup`): every test that uses the session's Ray cluster runs in one worker
(one cluster, one Serve), and so does every test of the real Gemma3 vocabulary; GPU tests run in one worker, one
after another, as they would without xdist. The tests of demo models spread over every worker like the rest: each
worker reads a demo model once (tests/conftest.py), and their reference forwards, the largest part of their time,
would otherwise queue behind one core."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from tests.slow_probe import sitecustomize as probe

PROBE_DIR = Path(__file__).parent / "slow_probe"
PROBE = os.path.join(tempfile.mkdtemp(prefix="qcls-probe-"), "events")
# fixtures that start or join the session's Ray cluster: their users share a worker
RAY_FIXTURES = {"ray_session"}
# the real Gemma3 tokenizer (262,144 tokens; seconds to read, again in each tiny model built on it): read by one worker
GEMMA_VOCABULARY = {"gemma_tokenizer"}

_offset = 0
_caused: dict[str, str] = {}  # fixture name -> the first slow thing its setup did


def install() -> None:
    """Record events from this process and from the processes it starts (they run the probe as sitecustomize)."""
    os.environ["QCLS_TEST_PROBE"] = PROBE
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROBE_DIR), os.environ.get("PYTHONPATH")]))
    probe.install(PROBE)


# the tree-attention kernels: interpreted, the most expensive thing a CPU test does
TREE_KERNELS = ("qcls.engine.tree_kernels", "qcls.engine.row_kernel")


def watch_interpreter() -> None:
    """Record each tree-attention kernel launch that Triton's interpreter runs (TRITON_INTERPRET=1, set by the
    conftest on a machine without a GPU)."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    run = interpreter.GridExecutor.__call__

    def call(self, *args, **kwargs):
        if getattr(self.fn, "__module__", "") in TREE_KERNELS:
            probe._record(PROBE, "runs the tree-attention kernels in Triton's interpreter")
        return run(self, *args, **kwargs)
    interpreter.GridExecutor.__call__ = call


def _drain() -> list[str]:
    global _offset
    try:
        with open(PROBE, "rb") as f:
            f.seek(_offset)
            data = f.read()
    except FileNotFoundError:
        return []
    _offset += len(data)
    return [ln for ln in data.decode(errors="replace").splitlines() if ln]


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_collection_modifyitems(items):
    # before every other implementation: xdist's (in a worker) turns the groups into the tests' ids
    for item in items:
        names = set(item.fixturenames)
        if item.get_closest_marker("gpu"):
            item.add_marker(pytest.mark.xdist_group("gpu"))
        elif names & RAY_FIXTURES:
            item.add_marker(pytest.mark.xdist_group("ray"))
        elif names & GEMMA_VOCABULARY:
            item.add_marker(pytest.mark.xdist_group("gemma-vocabulary"))
    # the slow tests first (in their own order): xdist hands out a group first and then single tests in this order,
    # so the long ones start early and the short ones fill both workers up to the end
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    _drain()
    yield
    events = _drain()
    if events:
        _caused.setdefault(fixturedef.argname, events[0])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    _drain()
    yield
    item.stash[_BODY] = _drain()


_BODY = pytest.StashKey[list]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or not report.passed or item.get_closest_marker("slow"):
        return
    did = [f"it {e}" for e in item.stash.get(_BODY, [])[:1]]
    did += [f"its fixture {name!r} {_caused[name]}" for name in item.fixturenames if name in _caused][:1]
    if did:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} is not marked slow, but {did[0]}: mark it @pytest.mark.slow (a slow "
                           "test loads a demo model, starts Ray, or starts a process that does, runs a benchmark "
                           "script or interprets the tree-attention kernels: tests/slow_marker.py)")
