"""Learned heads in the engine (docs/design.md §10): a head fitted on a tiny model gives the same probabilities
through the fast engine (packed rows, taps, the tail's feature product) as through plain transformers
forwards with the head applied in numpy (≤ 1e-4), for every read, every strategy, multi-token and colliding
labels, batch 1–4; raw scores are untouched."""
from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from qcls.backends.registry import get_backend
from qcls.classifier import Classifier
from qcls.fitting import head_fitting
from qcls.fitting import heads as H
from qcls.eval.dataset import load_eval_set
from qcls.heads import files
from qcls.heads.head import Read
from qcls.scoring.reference import reference_states
from qcls.scoring.tokenization import encode_query
from tests.conftest import prompt, tiny_cfg
from tests.engine.test_equivalence import MULTI, QUERIES, SHARED, SINGLE, STRATEGIES

TOL = 1e-4
WORDS = "red blue slim fit jeans dress boys hoodie cotton summer 女士 连衣裙 maternity tee knit".split()


def labelled_set(path: Path, prompts: list[dict], n: int = 30, seed: int = 0) -> Path:
    """Random queries, each label of each prompt gold ≥ 3 times (the rows cycle through the labels)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        q = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))
        rows.append({"query": f"{q} {i}", "labels": {p["name"]: p["labels"][(i + 3 * k) % len(p["labels"])]
                                                      for k, p in enumerate(prompts)}})
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def fitted(model_dir: str, prompts: list[dict], reads: list[Read], with_scores: bool, tmp_path: Path,
           strategy: str = "trie", **extra):
    """(loaded model, head file) of a head fitted with qcls's own engine on a random labelled set."""
    cfg = tiny_cfg(model_dir, prompts, scoring={"name": strategy}, **extra)
    loaded = get_backend("fp16").load(cfg)
    data = load_eval_set(labelled_set(tmp_path / "fit.jsonl", prompts), cfg.prompts, None)
    taps = H.taps_of(reads)
    clf = Classifier(cfg, loaded=loaded, taps=taps)
    head = head_fitting.fit(clf, head_fitting.read_set(clf, data), taps, reads, with_scores, 3, "fit.jsonl")
    files.save(head, tmp_path / "head.yaml")
    return loaded, tmp_path / "head.yaml", head


def plain_probs(loaded, clf: Classifier, head, query: str) -> dict[str, np.ndarray]:
    """Per prompt: the head applied in numpy to states from a plain transformers forward and the fast engine's
    raw scores (held to the reference by tests/engine/test_equivalence.py)."""
    ids = encode_query(clf.tokenizer, query, clf.cfg.max_query_tokens)
    raw = {p.prompt: [s.score for s in p.labels] for p in clf.classify([query])[0].prompts}
    out = {}
    for lay in clf.layouts:
        ph = head.prompts[lay.tokens.name]
        feats = reference_states(loaded.model, lay.tokens, ids, ph.read.taps).numpy().reshape(-1) if ph.read else None
        logits = np.array(ph.apply(raw[lay.tokens.name], feats))
        e = np.exp(logits - logits.max())
        out[lay.tokens.name] = e / e.sum()
    return out


def assert_head_same(fast: Classifier, plain: Classifier, loaded, head, queries: list[str]) -> None:
    got = fast.classify(queries)
    base = plain.classify(queries)
    for g, b in zip(got, base):
        want = plain_probs(loaded, plain, head, g.query)
        for gp, bp in zip(g.prompts, b.prompts):
            probs = np.array([s.prob for s in gp.labels])
            assert np.abs(probs - want[gp.prompt]).max() <= TOL, (g.query, gp.prompt)
            assert gp.label == gp.labels[int(np.argmax(want[gp.prompt]))].label
            if fast.depth.stops_early:  # the forward stopped at the head's layer: no label scores at all
                assert gp.raw_label is gp.raw_prob is None
                assert all(x.score is None and x.raw_prob is None for x in gp.labels)
                continue
            for x, y in zip(gp.labels, bp.labels):  # the raw scores stay in the result, as without a head
                assert abs(x.score - y.score) <= 1e-6 and abs(x.raw_prob - y.prob) <= 1e-6
            assert (gp.raw_label, gp.raw_prob) == (bp.label, pytest.approx(bp.prob, abs=1e-6))
        assert g.meta["calibration"] == fast.head_path


PROMPTS = [prompt("audience", MULTI), prompt("category", SHARED, system="Category?"),
           prompt("single", SINGLE, system="Single?")]


@pytest.mark.parametrize("read,with_scores", [(Read("final"), False), (Read(1, "position"), True),
                                              (Read(1, "query_mean"), False), (Read(1, "both"), True)])
def test_fitted_head_fast_equals_plain_forward(tiny_dirs, tmp_path, read, with_scores):
    loaded, path, head = fitted(tiny_dirs["qwen3"], PROMPTS, [read], with_scores, tmp_path)
    fast = Classifier(tiny_cfg(tiny_dirs["qwen3"], PROMPTS, calibration=str(path)), loaded=loaded)
    plain = Classifier(tiny_cfg(tiny_dirs["qwen3"], PROMPTS), loaded=loaded)
    assert fast.metadata()["head"]["reads_states"]
    for b in (1, 4, 2, 3):
        assert_head_same(fast, plain, loaded, head, QUERIES[:b])


def test_fitted_head_on_gemma3_with_windows_equals_plain_forward(tiny_dirs, tmp_path):
    """Gemma3 (sliding windows shorter than the prompt rows, (1 + w) norms): the taps the head reads are the
    residual stream transformers' forward computes."""
    long = [prompt("audience", MULTI, system="You label search queries for a fashion shop. " * 3),
            prompt("category", SHARED, system="Category?")]
    loaded, path, head = fitted(tiny_dirs["gemma3"], long, [Read(2, "both")], True, tmp_path)
    fast = Classifier(tiny_cfg(tiny_dirs["gemma3"], long, calibration=str(path)), loaded=loaded)
    plain = Classifier(tiny_cfg(tiny_dirs["gemma3"], long), loaded=loaded)
    assert 8 in fast.engine.dec.windows
    for b in (1, 3):
        assert_head_same(fast, plain, loaded, head, QUERIES[:b])


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_and_the_reference_engine(tiny_dirs, tmp_path, strategy):
    """The head reads the root state, so it works the same under every strategy; the reference engine
    (engine.kind=reference) applies the same file to plain forwards."""
    prompts = PROMPTS if strategy != "first_token" else [prompt("single", SINGLE),
                                                         prompt("first", ["man", "woman", "boy", "girl", "none"])]
    loaded, path, head = fitted(tiny_dirs["llama"], prompts, [Read(1, "both")], True, tmp_path, strategy)
    fast = Classifier(tiny_cfg(tiny_dirs["llama"], prompts, scoring={"name": strategy}, calibration=str(path)),
                      loaded=loaded)
    ref = Classifier(tiny_cfg(tiny_dirs["llama"], prompts, scoring={"name": strategy}, calibration=str(path),
                              engine={"kind": "reference"}), loaded=loaded)
    got, want = fast.classify(QUERIES[:3]), ref.classify(QUERIES[:3])
    for g, w in zip(got, want):
        for gp, wp in zip(g.prompts, w.prompts):
            assert max(abs(x.prob - y.prob) for x, y in zip(gp.labels, wp.labels)) <= TOL, (g.query, gp.prompt)
            assert gp.label == wp.label


def test_real_qwen_tokenizer_chinese_labels_and_states_equal_plain_forward(tiny_dirs, tmp_path):
    """Colliding multi-token Chinese labels under the real Qwen tokenizer; and the states the engine reads for
    fitting are the plain forward's (every tap, every prompt, a batch of 2)."""
    prompts = [prompt("aud", ["男童", "女童", "男士", "女士", "孕妇", "无"]),
               prompt("cat", ["连衣裙", "牛仔裤", "衬衫", "风衣", "其他"], system="Category?")]
    reads = [Read(1, "both"), Read("final")]
    loaded, path, head = fitted(tiny_dirs["qwen3_qwentok"], prompts, reads, False, tmp_path,
                                engine={"max_batch_size": 2})
    taps = H.taps_of(reads)
    clf = Classifier(tiny_cfg(tiny_dirs["qwen3_qwentok"], prompts, engine={"max_batch_size": 2}), loaded=loaded,
                     taps=taps)
    queries = ["夏季女士碎花连衣裙", "孕妇装 dress"]
    _, states = clf.read_states(queries)
    for q, st in zip(queries, states):
        ids = encode_query(clf.tokenizer, q, clf.cfg.max_query_tokens)
        for j, lay in enumerate(clf.layouts):
            want = reference_states(loaded.model, lay.tokens, ids, taps).numpy()
            assert np.abs(st[:, j].numpy() - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max()))
    fast = Classifier(tiny_cfg(tiny_dirs["qwen3_qwentok"], prompts, calibration=str(path),
                               engine={"max_batch_size": 2}), loaded=loaded)
    plain = Classifier(tiny_cfg(tiny_dirs["qwen3_qwentok"], prompts, engine={"max_batch_size": 2}), loaded=loaded)
    assert_head_same(fast, plain, loaded, head, queries)


def test_head_file_round_trip_serves_the_same(tiny_dirs, tmp_path):
    """What is fitted in memory, saved and loaded again classifies identically (the file loses nothing that
    matters: weights are float32)."""
    loaded, path, head = fitted(tiny_dirs["qwen2"], PROMPTS, [Read(1, "both")], True, tmp_path)
    fast = Classifier(tiny_cfg(tiny_dirs["qwen2"], PROMPTS, calibration=str(path)), loaded=loaded)
    plain = Classifier(tiny_cfg(tiny_dirs["qwen2"], PROMPTS), loaded=loaded)
    assert_head_same(fast, plain, loaded, head, QUERIES[:4])


@pytest.mark.gpu
def test_gpu_head_keeps_graphs_and_matches_fp32_reference(tiny_dirs, tmp_path):
    """fp16 with CUDA graphs: a head reading an intermediate layer and the final state adds no CUDA graph and
    no allocation on the request path, and its probabilities are the fp32 reference engine's within 1e-3."""
    import torch
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: run on a GPU machine")
    d = tiny_dirs["qwen3"]
    reads = [Read(1, "both"), Read("final")]
    _, path, _ = fitted(d, PROMPTS, reads, True, tmp_path)
    cuda = {"device": "cuda"}
    fast = Classifier(tiny_cfg(d, PROMPTS, backend=cuda, calibration=str(path)))
    plain = Classifier(tiny_cfg(d, PROMPTS, backend=cuda))
    ref = Classifier(tiny_cfg(d, PROMPTS, backend={"device": "cuda", "dtype": "float32"}, calibration=str(path),
                              engine={"kind": "reference"}))

    def n_graphs(clf):
        return sum(len(bk.graphs) for bk in clf.engine.buckets.values() if bk.graphs)
    assert fast.engine.graphs and n_graphs(fast) == n_graphs(plain) > 0
    for b in (1, 2, 3, 4):
        for g, w in zip(fast.classify(QUERIES[:b]), ref.classify(QUERIES[:b])):
            for gp, wp in zip(g.prompts, w.prompts):
                assert max(abs(x.prob - y.prob) for x, y in zip(gp.labels, wp.labels)) <= 1e-3, (g.query, gp.prompt)
    fast.classify(QUERIES[:4])
    before = torch.cuda.memory_stats()
    for i in range(8):
        fast.classify(QUERIES[: 1 + i % 4])
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before["allocation.all.allocated"]
