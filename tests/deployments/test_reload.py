"""Hot reload without Ray: the Reloader's requests and their outcome over a worker that builds beside the serving
configuration, then swaps, with refusals (what a reload may change: tests/config/test_reloads.py; the build between
batches: test_worker_steps.py; the real Serve round trip: test_operations.py)."""
from __future__ import annotations

import threading

import pytest

from qcls.config.compose import ConfigError, compose
from qcls.deployments.reload import Reloader
from qcls.deployments.worker import EngineWorker
from tests.deployments.helpers import until


class FakeClassifier:
    """A configuration as the worker and the Reloader see it: its build (`in_steps`, on the device's owner) waits for
    `gate`, then raises `fail` if set."""

    fail: Exception | None = None
    gate = threading.Event()

    @classmethod
    def in_steps(cls, cfg, loaded=None):
        yield "the one step"
        FakeClassifier.gate.wait(30)
        if FakeClassifier.fail is not None:
            raise FakeClassifier.fail
        return cls(cfg, loaded)

    def __init__(self, cfg, loaded=None):
        self.by_owner = threading.current_thread().name == "qcls-launch"
        self.cfg, self.loaded, self.device_ms = cfg, loaded, {}
        self.fingerprint = "+".join(p.name for p in cfg.prompts)

    @property
    def prompt_names(self):
        return [p.name for p in self.cfg.prompts]


class Metrics:
    def __init__(self):
        self.outcomes: list[str] = []
        self.cache_sizes: list[int] = []

    def reload_outcome(self, outcome):
        self.outcomes.append(outcome)

    def cache_size(self, entries):
        self.cache_sizes.append(entries)


@pytest.fixture
def replica(monkeypatch):
    """(Reloader, worker, metrics, the threads that gave memory back) over a fake Classifier."""
    from qcls.deployments import reload as reload_module

    freed: list[str] = []
    monkeypatch.setattr(reload_module, "free_device_memory", lambda clf: freed.append(threading.current_thread().name))
    FakeClassifier.fail = None
    FakeClassifier.gate.set()
    worker, metrics = EngineWorker(FakeClassifier(compose([]), loaded="weights")), Metrics()
    yield Reloader(worker, {"overrides": []}, metrics), worker, metrics, freed
    worker.close()


def _wait(r, status="building"):
    for _ in range(600):
        if r.state.status != status:
            return r.state
        threading.Event().wait(0.05)
    pytest.fail("the reload never finished")


def test_a_reload_builds_beside_the_serving_one_on_its_weights_then_swaps(replica):
    r, worker, metrics, freed = replica
    old = worker.clf
    r.request(None)  # Serve's call at start-up: the app's own config, nothing to build
    assert worker.clf is old and r.state.status == "serving" and metrics.outcomes == []
    FakeClassifier.gate.clear()  # the build waits: the old one must still be active meanwhile
    fewshot = compose(["prompts=default_fewshot"]).model_dump(mode="json", exclude={"serve"})
    r.request({"config": {**fewshot, "prompts": [{**p, "name": p["name"] + "_v2"} for p in fewshot["prompts"]]},
               "id": "r1"})
    assert r.state.status == "building" and r.state.request_id == "r1" and worker.clf is old
    assert r.outcome("r1", 0.05) is None  # still building
    FakeClassifier.gate.set()
    st = r.outcome("r1", 30)  # what `qcls reload`, the playground and a handle wait with
    assert st == r.state.as_dict() and r.outcome("another", 0.05) is None
    st = r.state
    assert st.status == "serving" and st.prompts == ["category_v2", "audience_v2"] and st.request_id == "r1"
    assert worker.clf is not old and worker.clf.loaded == "weights"
    assert metrics.outcomes == ["serving"] and metrics.cache_sizes == [0]  # the new result cache starts empty
    assert worker.clf.by_owner and not old.by_owner  # built by the device's owner, step by step


def test_once_live_the_first_reload_of_a_replica_deployed_without_user_config_builds_in_a_thread(replica):
    """Without a user_config Serve calls no reconfigure() at start-up: the first one comes under traffic, and
    building it inside reconfigure() would hold Serve's call (the replica shows as updating) for the whole build."""
    r, worker, metrics, freed = replica
    old = worker.clf
    r.live()  # Serve's first health check
    FakeClassifier.gate.clear()  # the build waits: request() must return meanwhile
    r.request({"overrides": ["prompts=default_fewshot"], "id": "first"})
    assert r.state.status == "building" and worker.clf is old
    FakeClassifier.gate.set()
    assert _wait(r).status == "serving" and worker.clf is not old and metrics.outcomes == ["serving"]


def test_a_bad_or_weight_changing_reload_is_refused_and_the_old_one_keeps_serving(replica):
    r, worker, metrics, freed = replica
    r.request(None)
    old = worker.clf
    r.request({"overrides": ["model=smollm2_demo"], "id": "w"})
    st = _wait(r)
    assert st.status == "refused" and "model" in st.detail and "deploy it anew" in st.detail and worker.clf is old
    assert freed == []  # refused by the rules: nothing was built
    FakeClassifier.fail = ConfigError("prompt 'category' reads layer 20, only 12 are loaded", "load more layers")
    r.request({"overrides": ["prompts=default_fewshot"], "id": "b"})
    st = _wait(r)
    assert st.status == "refused" and "layer 20" in st.detail and "load more layers" in st.detail
    assert worker.clf is old and metrics.outcomes == ["refused", "refused"]
    # the failed build's memory goes back, by the device's owner (empty_cache synchronizes the device)
    until(lambda: freed, "the failed build's memory to go back")
    assert freed == ["qcls-launch"]
    r.request({"overrides": [], "id": "back"})  # a roll-back to what serves: nothing built, the refusal still shown
    st = _wait(r)
    assert st.status == "serving" and st.request_id == "back" and "layer 20" in st.last_refusal


def test_a_request_during_a_build_supersedes_it_and_its_outcome_is_the_last_ones(replica):
    """Two requests in a row: the first one's build is dropped at its next step, the second one serves, and waiting
    for the first one's outcome gives up (it was superseded)."""
    r, worker, metrics, freed = replica
    r.live()
    FakeClassifier.gate.clear()
    r.request({"overrides": ["prompts=default_fewshot"], "id": "one"})
    until(lambda: worker._builds, "the first build")
    r.request({"overrides": [], "id": "two"})  # back to what serves, while "one" builds
    until(lambda: worker._builds[0].superseded, "the second request to reach the worker")
    FakeClassifier.gate.set()
    st = r.outcome("two", 30)
    assert st is not None and st["status"] == "serving" and r.outcome("one", 0.05) is None
    until(lambda: not worker._builds, "the first build to be dropped")
    assert worker.clf.prompt_names == ["category", "audience"] and metrics.outcomes == []


@pytest.mark.parametrize("frozen_cycle", [False, True], ids=["dropped", "frozen-cycle"])
def test_a_swapped_out_classifier_is_freed_once_its_queries_are_answered(tiny_dirs, frozen_cycle):
    """The old configuration's engine (K/V buffers, prefix cache, graphs) must not outlive the swap: once the
    queries queued on it are answered, nothing holds the old Classifier, even on an idle replica (no batch on the
    new one yet), and a reload's build after it reuses its memory instead of adding to it. frozen-cycle: the first
    one sits in a reference cycle and Serve froze the garbage collector after start-up, as replicas run."""
    import asyncio
    import gc
    import weakref

    from qcls.classifier import Classifier
    from qcls.deployments.worker import Pending
    from tests.conftest import prompt, tiny_cfg

    cfg = tiny_cfg(tiny_dirs["qwen3"], [prompt("category", ["shoe", "shirt"]), prompt("audience", ["men", "women"])])
    first = Classifier(cfg)
    worker = EngineWorker(first)
    r = Reloader(worker, {"overrides": []})
    dump = cfg.model_dump(mode="json", exclude={"serve"})
    r.request({"config": dump})  # Serve's call at start-up: what serves already
    gone = weakref.ref(first)
    if frozen_cycle:
        first.in_a_cycle = first
        gc.freeze()

    async def answer(queries):
        return [await f for f in worker.submit([Pending(q, 0.0) for q in queries])]

    try:
        assert all(x.ok for x in asyncio.run(answer(["red dress", "boots"])))
        del first
        for k in (1, 2):  # two reloads: each frees the one it replaced
            r.request({"config": {**dump, "prompts": [{**p, "name": f"{p['name']}_v{k}"} for p in dump["prompts"]]}})
            st = _wait(r)
            assert st.status == "serving" and st.prompts == [f"category_v{k}", f"audience_v{k}"], st.detail
            for _ in range(100):  # an idle replica: no batch on the new one has replaced anything of the old
                if gone() is None:
                    break
                threading.Event().wait(0.05)
            assert gone() is None, [type(x).__name__ for x in gc.get_referrers(gone())]
            out = asyncio.run(answer(["red dress"]))
            assert out[0].ok and [p.prompt for p in out[0].prompts] == st.prompts
            gone = weakref.ref(worker.clf)
    finally:
        gc.unfreeze()
        worker.close()
