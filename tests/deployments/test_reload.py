"""Hot reload without Ray: the Reloader's build-beside-then-swap with refusals (what a reload may change:
tests/config/test_reloads.py; the real Serve round trip: test_operations.py)."""
from __future__ import annotations

import threading

import pytest

from qcls.config.compose import ConfigError, compose
from qcls.deployments.reload import Reloader, run_here


class Owner:
    """The replica's device owner as a Reloader sees it (EngineWorker.run_steps): records what it runs."""

    def __init__(self):
        self.log: list[str] = []
        self.running = False

    def run_steps(self, steps):
        self.log.append("steps")
        self.running = True
        try:
            return run_here(steps)
        finally:
            self.running = False


class FakeClassifier:
    built: list = []
    fail: Exception | None = None
    gate = threading.Event()
    owner: Owner | None = None

    @classmethod
    def in_steps(cls, cfg, loaded=None):
        yield
        return cls(cfg, loaded)

    def __init__(self, cfg, loaded=None):
        FakeClassifier.gate.wait(30)
        self.by_owner = FakeClassifier.owner is not None and FakeClassifier.owner.running
        if FakeClassifier.fail is not None:
            raise FakeClassifier.fail
        self.cfg, self.loaded = cfg, loaded
        self.fingerprint = "+".join(p.name for p in cfg.prompts)
        FakeClassifier.built.append(self)

    @property
    def prompt_names(self):
        return [p.name for p in self.cfg.prompts]


def _reloader(monkeypatch, cfg):
    import qcls.classifier
    from qcls.deployments import reload
    monkeypatch.setattr(qcls.classifier, "Classifier", FakeClassifier)
    owner = Owner()
    # (an earlier test's swap may still be waiting for its replaced Classifier: its "free" is not this test's)
    def free(clf):
        if clf in FakeClassifier.built:
            owner.log.append(f"free by owner {owner.running}")
        return None  # as off CUDA: nothing given back to report

    monkeypatch.setattr(reload, "free_device_memory", free)
    FakeClassifier.built, FakeClassifier.fail, FakeClassifier.owner = [], None, owner
    FakeClassifier.gate.set()
    active = [FakeClassifier(cfg, loaded="weights")]
    outcomes = []
    r = Reloader(lambda: active[0], lambda clf: active.__setitem__(0, clf), {"overrides": []}, outcomes.append,
                 owner.run_steps)
    return r, active, outcomes, owner


def _wait(r, status="building"):
    for _ in range(600):
        if r.state.status != status:
            return r.state
        threading.Event().wait(0.05)
    pytest.fail("the reload never finished")


def test_a_reload_builds_beside_the_serving_one_on_its_weights_then_swaps(monkeypatch):
    r, active, outcomes, owner = _reloader(monkeypatch, compose([]))
    old = active[0]
    r.request(None)  # Serve's call at start-up: the app's own config, nothing to build
    assert active[0] is old and r.state.status == "serving" and outcomes == []
    FakeClassifier.gate.clear()  # the build waits: the old one must still be active meanwhile
    fewshot = compose(["prompts=default_fewshot"]).model_dump(mode="json", exclude={"serve"})
    r.request({"config": {**fewshot, "prompts": [{**p, "name": p["name"] + "_v2"} for p in fewshot["prompts"]]},
               "id": "r1"})
    assert r.state.status == "building" and r.state.request_id == "r1" and active[0] is old
    assert r.outcome("r1", 0.05) is None  # still building
    FakeClassifier.gate.set()
    st = r.outcome("r1", 30)  # what `qcls reload`, the playground and a handle wait with
    assert st == r.state.as_dict() and r.outcome("another", 0.05) is None
    st = r.state
    assert st.status == "serving" and st.prompts == ["category_v2", "audience_v2"] and st.request_id == "r1"
    assert active[0] is not old and active[0].loaded == "weights" and outcomes == ["serving"]
    assert active[0].by_owner and not old.by_owner  # built by the device's owner, step by step


def test_once_live_the_first_reload_of_a_replica_deployed_without_user_config_builds_in_a_thread(monkeypatch):
    """Without a user_config Serve calls no reconfigure() at start-up: the first one comes under traffic, and
    building it inside reconfigure() would hold Serve's call (the replica shows as updating) for the whole build."""
    r, active, outcomes, owner = _reloader(monkeypatch, compose([]))
    old = active[0]
    r.live()  # Serve's first health check
    FakeClassifier.gate.clear()  # the build waits: request() must return meanwhile
    r.request({"overrides": ["prompts=default_fewshot"], "id": "first"})
    assert r.state.status == "building" and active[0] is old
    FakeClassifier.gate.set()
    assert _wait(r).status == "serving" and active[0] is not old and outcomes == ["serving"]


def test_a_bad_or_weight_changing_reload_is_refused_and_the_old_one_keeps_serving(monkeypatch):
    r, active, outcomes, owner = _reloader(monkeypatch, compose([]))
    r.request(None)
    old = active[0]
    r.request({"overrides": ["model=smollm2_demo"], "id": "w"})
    st = _wait(r)
    assert st.status == "refused" and "model" in st.detail and "deploy it anew" in st.detail and active[0] is old
    FakeClassifier.fail = ConfigError("prompt 'category' reads layer 20, only 12 are loaded", "load more layers")
    r.request({"overrides": ["prompts=default_fewshot"], "id": "b"})
    st = _wait(r)
    assert st.status == "refused" and "layer 20" in st.detail and "load more layers" in st.detail
    assert active[0] is old and outcomes == ["refused", "refused"]
    # a failed build's memory is freed by the device's owner (empty_cache synchronizes the device)
    assert owner.log == ["steps", "free by owner True", "steps", "steps", "free by owner True"], owner.log
    r.request({"overrides": [], "id": "back"})  # a roll-back to what serves: nothing built, the refusal still shown
    st = _wait(r)
    assert st.status == "serving" and st.request_id == "back" and "layer 20" in st.last_refusal


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
    from qcls.deployments.worker import EngineWorker, Pending
    from tests.conftest import prompt, tiny_cfg

    cfg = tiny_cfg(tiny_dirs["qwen3"], [prompt("category", ["shoe", "shirt"]), prompt("audience", ["men", "women"])])
    first = Classifier(cfg)
    worker, active = EngineWorker(first), [first]

    def swap(clf):
        worker.swap(clf)
        active[0] = clf

    r = Reloader(lambda: active[0], swap, {"overrides": []}, run_steps=worker.run_steps)  # as a replica builds
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
            gone = weakref.ref(active[0])
    finally:
        gc.unfreeze()
        worker.close()


def test_the_swap_logs_when_the_replaced_configuration_is_dropped_and_what_its_memory_became(monkeypatch, caplog):
    """The GPU-only log line (CPU machines have no allocator cache to give back): its figures, formatted."""
    import logging
    import weakref

    from qcls.deployments import reload

    class Old:
        pass

    old = Old()
    replaced = weakref.ref(old)
    owner = Owner()
    monkeypatch.setattr(reload, "free_device_memory",
                        lambda clf: owner.log.append(f"free by owner {owner.running}") or (12.5, 9.75, 9.5))
    del old
    with caplog.at_level(logging.WARNING, logger=reload.log.name):
        reload._free_when_replaced(replaced, new=None, run_steps=owner.run_steps)
    assert owner.log == ["steps", "free by owner True"]  # empty_cache synchronizes the device: not beside a batch
    assert "memory reserved by torch 12.50 → 9.75 GiB (allocated 9.50 GiB)" in caplog.text
    assert "(0 garbage collections)" in caplog.text
