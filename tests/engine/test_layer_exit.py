"""The forward that stops at the head's layer (docs/design.md §11): with every prompt answered by a head that reads
layer L, only L layers are loaded and run, and the probabilities are those of the same head with the exit off
(fp32, ≤ 1e-5) for every family, both read kinds, batch 1-4; a prompt set that needs label scores keeps the whole
depth and says which prompt; weights with fewer layers than a configuration reads are refused with the numbers."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from qcls.backends.registry import get_backend
from qcls.classifier import Classifier
from qcls.errors import ConfigError
from qcls.heads.weights_fingerprint import weights_fingerprint
from qcls.heads.head import Read
from tests.conftest import prompt, tiny_cfg
from tests.engine.test_equivalence import MULTI, QUERIES, SHARED, SINGLE
from tests.engine.test_heads_engine import fitted

TOL = 1e-5
PROMPTS = [prompt("audience", MULTI), prompt("category", SHARED, system="Category?"),
           prompt("single", SINGLE, system="Single?")]


def headed(d: str, read: Read, tmp_path, prompts=PROMPTS, with_scores: bool = False):
    """(the whole model, a head file reading `read`): a head fitted with qcls's own tools, its feature weights then
    redrawn at a moderate scale. A head fitted on random labels of a random model has weights of ~1e4 (features
    with almost no spread, standardised), which turn the last-bit differences of two packings (fp32 sums over
    other key counts) into 1e-3 of probability; what is compared here is the engine, not the fit."""
    full, path, head = fitted(d, prompts, [read], with_scores, tmp_path)
    rng = np.random.default_rng(0)
    for ph in head.prompts.values():
        if ph.feature_weights is not None:
            ph.feature_weights = rng.normal(0.0, 0.3, ph.feature_weights.shape)
    head.save(path)
    return full, path


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.device.type != "meta")


def assert_same_probs(a: Classifier, b: Classifier, queries: list[str]) -> None:
    for x, y in zip(a.classify(queries), b.classify(queries)):
        for xp, yp in zip(x.prompts, y.prompts):
            got, want = np.array([s.prob for s in xp.labels]), np.array([s.prob for s in yp.labels])
            assert np.abs(got - want).max() <= TOL, (x.query, xp.prompt)
            assert xp.label == yp.label


@pytest.mark.parametrize("family,read", [("llama", Read(1, "position")), ("qwen2", Read(1, "both")),
                                         ("qwen3", Read(1, "query_mean")), ("gemma3", Read(2, "position")),
                                         ("gemma3", Read(1, "both"))])
def test_exit_loads_and_runs_only_the_heads_layers(tiny_dirs, tmp_path, family, read):
    d = tiny_dirs[family]
    full, path = headed(d, read, tmp_path)
    total = full.model.config.num_hidden_layers
    on = Classifier(tiny_cfg(d, PROMPTS, calibration=str(path)))
    off = Classifier(tiny_cfg(d, PROMPTS, calibration=str(path), engine={"layer_exit": False}))
    assert on.depth.layers == read.layer < total and off.depth.layers == total
    # only the read layers' parameters (and no untied LM head) were loaded
    base = full.model.model
    want = sum(p.numel() for p in base.embed_tokens.parameters()) + sum(p.numel() for p in base.norm.parameters())
    want += sum(p.numel() for layer in base.layers[:read.layer] for p in layer.parameters())
    assert n_params(on.loaded.model) == want < n_params(full.model)
    assert len(on.loaded.model.model.layers) == read.layer and on.engine.dec.k.shape[0] == read.layer
    assert weights_fingerprint(on.loaded.model) == weights_fingerprint(full.model)
    for b in (1, 4, 2, 3):
        assert_same_probs(on, off, QUERIES[:b])
    r = on.classify(QUERIES[:1])[0]
    assert r.meta["layers"] == {"layers": read.layer, "of": total, "loaded": read.layer, "label_scores": False,
                                "why": on.depth.reason} and "prompt 'audience'" in on.depth.reason
    for p in r.prompts:  # no raw scores: the final norm and the LM-head rows never ran
        assert p.raw_label is None and p.raw_prob is None and all(s.score is None for s in p.labels)
        assert all(s.head_score is not None for s in p.labels)
    # no trie tokens in the rows: a forward of the exit holds fewer tokens than one that scores multi-token labels
    assert r.meta["tokens_per_forward"] < off.classify(QUERIES[:1])[0].meta["tokens_per_forward"]


def test_a_prompt_without_a_head_keeps_the_whole_depth_and_says_which(tiny_dirs, tmp_path):
    d = tiny_dirs["qwen3"]
    _, path = headed(d, Read(1, "both"), tmp_path, PROMPTS[:2])
    mixed = Classifier(tiny_cfg(d, PROMPTS, calibration=str(path)))  # 'single' has no head in the file
    assert not mixed.depth.stops_early and "prompt 'single' has no head" in mixed.depth.reason
    r = mixed.classify(QUERIES[:2])[0]
    assert r.meta["layers"]["layers"] == r.meta["layers"]["of"] == 2
    assert all(s.score is not None for p in r.prompts for s in p.labels)


def test_heads_that_read_scores_or_the_final_state_keep_the_whole_depth(tiny_dirs, tmp_path):
    d = tiny_dirs["llama"]
    (tmp_path / "s").mkdir(), (tmp_path / "f").mkdir()
    _, scores, _ = fitted(d, PROMPTS, [Read(1, "position")], True, tmp_path / "s")
    _, final, _ = fitted(d, PROMPTS, [Read("final")], False, tmp_path / "f")
    a = Classifier(tiny_cfg(d, PROMPTS, calibration=str(scores)))
    b = Classifier(tiny_cfg(d, PROMPTS, calibration=str(final)))
    assert "reads the label scores" in a.depth.reason and "reads the final state" in b.depth.reason
    assert not a.depth.stops_early and not b.depth.stops_early


def test_weights_with_fewer_layers_than_a_head_reads_are_refused(tiny_dirs, tmp_path):
    d = tiny_dirs["gemma3"]
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    _, shallow, _ = fitted(d, PROMPTS, [Read(1, "position")], False, tmp_path / "a")
    _, deep, _ = fitted(d, PROMPTS, [Read(2, "position")], False, tmp_path / "b")
    first = Classifier(tiny_cfg(d, PROMPTS, calibration=str(shallow)))
    assert first.loaded.layers == 1 and first.loaded.layers_total == 3
    with pytest.raises(ConfigError, match="reads 2 of the model's 3 decoder layers.*only the first 1 are loaded"):
        Classifier(tiny_cfg(d, PROMPTS, calibration=str(deep)), loaded=first.loaded)
    with pytest.raises(ConfigError, match="reads 3 of the model's 3"):  # label scores need every layer
        Classifier(tiny_cfg(d, PROMPTS), loaded=first.loaded)
    # the same weights serve any configuration that reads no deeper
    again = Classifier(tiny_cfg(d, PROMPTS, calibration=str(shallow), engine={"max_batch_size": 2}),
                       loaded=first.loaded)
    assert again.depth.layers == 1


def test_reference_engine_runs_every_layer_with_the_same_probabilities(tiny_dirs, tmp_path):
    d = tiny_dirs["qwen2"]
    _, path = headed(d, Read(1, "position"), tmp_path)
    fast = Classifier(tiny_cfg(d, PROMPTS, calibration=str(path)))
    ref = Classifier(tiny_cfg(d, PROMPTS, calibration=str(path), engine={"kind": "reference"}))
    assert fast.depth.stops_early and ref.depth.layers == ref.depth.total
    got, want = fast.classify(QUERIES[:2]), ref.classify(QUERIES[:2])
    for g, w in zip(got, want):
        for gp, wp in zip(g.prompts, w.prompts):
            assert max(abs(x.prob - y.prob) for x, y in zip(gp.labels, wp.labels)) <= 1e-4


@pytest.mark.gpu
def test_gpu_exit_keeps_graphs_and_allocates_nothing_per_request(tiny_dirs, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: run on a GPU machine")
    d = tiny_dirs["qwen3"]
    _, path = headed(d, Read(1, "both"), tmp_path)
    cuda = {"device": "cuda"}
    on = Classifier(tiny_cfg(d, PROMPTS, backend=cuda, calibration=str(path)))
    off = Classifier(tiny_cfg(d, PROMPTS, backend=cuda, calibration=str(path), engine={"layer_exit": False}))
    assert on.engine.graphs and on.depth.stops_early
    for b in (1, 2, 3, 4):
        for g, w in zip(on.classify(QUERIES[:b]), off.classify(QUERIES[:b])):
            for gp, wp in zip(g.prompts, w.prompts):
                assert max(abs(x.prob - y.prob) for x, y in zip(gp.labels, wp.labels)) <= 2e-3
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    for i in range(8):
        on.classify(QUERIES[: 1 + i % 4])
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gemma3_demo", "smollm2_demo"])
def test_demo_models_with_their_heads_stop_at_the_heads_layer(model, demo_cfg_overrides):
    """Real weights and the shipped heads (fitted with the whole depth): the same probabilities with the exit on as
    off (fp32, ≤ 1e-5). The model's default head stops the forward but loads every layer (a choice the user did not
    make must not refuse a later reload); the same file named as calibration=… loads only the read layers."""
    from qcls.config.compose import compose
    if model == "gemma3_demo":
        from tests.conftest import skip_without_gemma3_demo
        skip_without_gemma3_demo()
    over = [o for o in demo_cfg_overrides if not o.startswith("model=")] + [f"model={model}"]
    on = Classifier(compose(over))
    off = Classifier(compose(over + ["engine.layer_exit=false"]))
    named = Classifier(compose(over + [f"calibration={on.head_path}"]))
    reads = {ph.read.layer for ph in on.head.prompts.values()}
    assert on.heads.default and not named.heads.default
    assert on.depth.layers == named.depth.layers == max(reads) < on.depth.total == off.depth.layers
    assert len(on.loaded.model.model.layers) == on.depth.loads == on.depth.total
    assert len(named.loaded.model.model.layers) == named.depth.loads == named.depth.layers
    assert "all 18 layers loaded" in on.depth.line() or model != "gemma3_demo"
    assert n_params(named.loaded.model) < n_params(on.loaded.model) == n_params(off.loaded.model)
    assert weights_fingerprint(named.loaded.model) == weights_fingerprint(off.loaded.model)
    qs = ["mens slim fit jeans", "夏季女士碎花连衣裙", "boys hoodie", "red knit dress"]
    assert_same_probs(on, off, qs)
    assert_same_probs(named, off, qs)


@pytest.mark.parametrize("backend,options", [("fp16-offload", {"offload_layers": "true", "gpu_layers": 0}),
                                             ("bnb-int8", {"threshold": 0.0}), ("bnb-nf4", {})])
def test_every_backend_loads_only_the_heads_layers(tiny_dirs, tmp_path, backend, options):
    """The same head through each backend: only the read layers are loaded (and quantized, or kept on the host),
    and the probabilities are that backend's own with the exit off."""
    if backend.startswith("bnb"):
        pytest.importorskip("bitsandbytes")
    d = tiny_dirs["qwen2"]  # untied LM head: dropped too
    _, path = headed(d, Read(1, "position"), tmp_path)
    b = {"name": backend, "options": options}
    on = Classifier(tiny_cfg(d, PROMPTS, calibration=str(path), backend=b))
    off = Classifier(tiny_cfg(d, PROMPTS, calibration=str(path), backend=b, engine={"layer_exit": False}))
    assert len(on.loaded.model.model.layers) == 1 and len(off.loaded.model.model.layers) == 2
    assert on.loaded.model.get_output_embeddings().weight is None  # the untied head was never kept
    assert_same_probs(on, off, QUERIES[:3])
