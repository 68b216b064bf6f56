"""Calibration in the fast engine: equal to the reference with the same calibration (≤ 1e-4 in fp32), raw
scores untouched, and the same tail operators, buckets and CUDA graphs with and without it."""
from __future__ import annotations

import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from qcls.backends.registry import get_backend
from qcls.classifier import Classifier
from qcls.engine.tail import Tail
from qcls.fitting.calibration import contextual
from qcls.heads import files
from qcls.heads.head import Head, PromptHead
from qcls.scoring.strategies import get_strategy
from tests.conftest import prompt, tiny_cfg
from tests.engine.test_equivalence import MULTI, QUERIES, SHARED, SINGLE, STRATEGIES, TOL, tol
from tests.engine.test_gpu import TOL16, gpu_dirs  # noqa: F401  (gpu_dirs: the fixture of tempered checkpoints)


def random_calibration(path, prompts: list[dict], strategy: str, seed: int = 0, skip_last: bool = True,
                       push: dict[str, str] | None = None) -> str:
    """Plausible T in [1, 2.5] (so a raw error is not magnified) and biases N(0, 1.5); the last prompt is left
    out (the identity) when there are several. `push` {prompt: label} adds +20 to that label's bias."""
    rng = random.Random(seed)
    chosen = prompts[:-1] if skip_last and len(prompts) > 1 else prompts
    cal = {}
    for p in chosen:
        bias = [rng.gauss(0, 1.5) + (20.0 if (push or {}).get(p["name"]) == lab else 0.0) for lab in p["labels"]]
        cal[p["name"]] = PromptHead.temperature_bias(list(p["labels"]), rng.uniform(1.0, 2.5), bias)
    files.save(Head(cal, "temperature_bias", {"strategy": strategy, "model": "tiny"}), path)
    return str(path)


def trio(model_dir, prompts, strategy, tmp_path, seed=0, skip_last=True, **extra):
    """(fast with calibration, reference with the same calibration, fast without) on one loaded model. The
    calibration pushes the raw runner-up of the first query's first prompt, so at least one winner changes."""
    scoring = {"name": strategy}
    plain_cfg = tiny_cfg(model_dir, prompts, scoring=scoring, **extra)
    loaded = get_backend("fp16").load(plain_cfg)
    plain = Classifier(plain_cfg, loaded=loaded)
    first = plain.classify(QUERIES[:1])[0].prompts[0]
    runner_up = sorted(first.labels, key=lambda s: -s.score)[1].label
    path = random_calibration(tmp_path / "cal.yaml", prompts, strategy, seed, skip_last, {first.prompt: runner_up})
    cal_cfg = tiny_cfg(model_dir, prompts, scoring=scoring, calibration=path, **extra)
    ref_cfg = tiny_cfg(model_dir, prompts, scoring=scoring, calibration=path, engine={"kind": "reference"})
    return Classifier(cal_cfg, loaded=loaded), Classifier(ref_cfg, loaded=loaded), plain, path


def assert_calibrated_same(fast, ref, plain, queries) -> int:
    """Calibrated scores, probabilities and winners of fast == reference; raw fields of fast == a run without
    calibration. Returns how many (query, prompt) winners the calibration changed."""
    got, want, base = fast.classify(queries), ref.classify(queries), plain.classify(queries)
    flipped = 0
    for g, w, b in zip(got, want, base):
        assert g.meta["calibration"] == fast.head_path and b.meta["calibration"] is None
        for gp, wp, bp in zip(g.prompts, w.prompts, b.prompts):
            if gp.prompt not in fast.head.prompts:  # no entry in the file: the LLM's own scores, as without one
                assert gp.raw_label is None and wp.raw_label is None and gp.label == bp.label == wp.label
                for x, y, z in zip(gp.labels, wp.labels, bp.labels):
                    assert x.head_score is None and y.head_score is None and x.raw_prob is None
                    assert abs(x.score - z.score) <= 1e-6 and abs(x.prob - z.prob) <= 1e-6
                    assert abs(x.score - y.score) <= tol(y.score) and abs(x.prob - y.prob) <= TOL
                continue
            for x, y, z in zip(gp.labels, wp.labels, bp.labels):
                assert abs(x.head_score - y.head_score) <= tol(y.head_score), (g.query, gp.prompt)
                assert abs(x.prob - y.prob) <= TOL
                assert abs(x.score - y.score) <= tol(y.score)
                assert abs(x.score - z.score) <= 1e-6 and abs(x.raw_prob - z.prob) <= 1e-6  # raw: as without it
                assert z.head_score is None and z.raw_prob is None
            assert (gp.label, gp.raw_label) == (wp.label, wp.raw_label)
            assert abs(gp.prob - wp.prob) <= TOL and abs(gp.raw_prob - wp.raw_prob) <= TOL
            assert (gp.raw_label, gp.raw_prob) == (bp.label, pytest.approx(bp.prob, abs=1e-6))
            assert bp.raw_label is None and bp.raw_prob is None
            best = max(gp.labels, key=lambda s: s.head_score)
            assert gp.label == best.label and gp.prob == best.prob
            flipped += gp.label != gp.raw_label
    return flipped


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_calibrated_fast_equals_reference(tiny_dirs, tmp_path, family, strategy):
    prompts = [prompt("audience", MULTI), prompt("category", SHARED, system="Category?"),
               prompt("single", SINGLE, system="Single?")]
    if strategy == "first_token":  # shared first tokens cannot be told apart there
        prompts = [prompt("single", SINGLE), prompt("first", ["man", "woman", "boy", "girl", "none"])]
    fast, ref, plain, path = trio(tiny_dirs[family], prompts, strategy, tmp_path)
    assert any("no entry for prompts" in n for n in fast.notes) and not plain.notes
    m_cal, m_plain = fast.metadata(), plain.metadata()
    assert m_cal["buckets"] == m_plain["buckets"] and m_cal["graphs"] == m_plain["graphs"]
    assert m_cal["calibration"] == path and m_plain["calibration"] is None
    flipped = sum(assert_calibrated_same(fast, ref, plain, QUERIES[:b]) for b in (1, 2, 3, 4))
    assert flipped >= 4  # the pushed runner-up won in every batch: the comparison saw calibration act


def test_calibrated_real_qwen_tokenizer_chinese_labels(tiny_dirs, tmp_path):
    prompts = [prompt("aud", ["男童", "女童", "男士", "女士", "孕妇", "无"]),
               prompt("cat", ["连衣裙", "牛仔裤", "衬衫", "风衣", "半身裙", "其他"], system="Category?"),
               prompt("en", ["dress", "jeans", "none"], system="English?")]
    fast, ref, plain, _ = trio(tiny_dirs["qwen3_qwentok"], prompts, "trie", tmp_path, seed=3, skip_last=False,
                               engine={"max_batch_size": 2})
    for queries in (["夏季女士碎花连衣裙"], ["mens slim fit jeans", "孕妇装 dress"]):
        assert_calibrated_same(fast, ref, plain, queries)


def test_contextual_calibration_makes_the_content_free_input_uniform(tiny_dirs, tmp_path):
    """With one content-free input, p / p_cf on that input is uniform: b = −log p_cf cancels it exactly."""
    prompts = [prompt("a", MULTI), prompt("b", SHARED, system="B?")]
    cfg = tiny_cfg(tiny_dirs["qwen2"], prompts)
    loaded = get_backend("fp16").load(cfg)
    path = tmp_path / "cf.yaml"
    contextual(Classifier(cfg, loaded=loaded), ("N/A",)).save(path)
    fast = Classifier(tiny_cfg(tiny_dirs["qwen2"], prompts, calibration=str(path)), loaded=loaded)
    ref = Classifier(tiny_cfg(tiny_dirs["qwen2"], prompts, calibration=str(path), engine={"kind": "reference"}),
                     loaded=loaded)
    for clf in (fast, ref):
        for p in clf.classify(["N/A"])[0].prompts:
            assert max(abs(s.prob - 1 / len(p.labels)) for s in p.labels) < 1e-4
            assert max(abs(s.raw_prob - 1 / len(p.labels)) for s in p.labels) > 1e-3  # the raw ones were not


# ---- the tail: same operators with and without calibration ---------------------------------------------
class Record(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
        self.ops.append((func.name(), shapes))
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def tail_parts(tiny_dirs):
    prompts = [prompt("a", MULTI), prompt("b", SHARED, system="B?"), prompt("c", SINGLE, system="C?")]
    clf = Classifier(tiny_cfg(tiny_dirs["qwen3"], prompts))
    return clf.layouts, clf.loaded


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("b", [1, 3])
def test_tail_same_ops_and_affine_result(tail_parts, strategy, b):
    layouts, loaded = tail_parts
    plans = [get_strategy(strategy).plan(lay.trie) for lay in layouts]
    tokens = sorted({t for p in plans for t in p.entry_token})
    full = loaded.full_head() if plans[0].normaliser == "vocab" else None
    rng = random.Random(b)
    affine = [(rng.uniform(0.3, 3.0), [rng.gauss(0, 2) for _ in lay.tokens.labels]) for lay in layouts]
    heads = [PromptHead.temperature_bias(lay.tokens.labels, t, bias) for lay, (t, bias) in zip(layouts, affine)]
    args = (plans, b, loaded.head_rows(tokens), tokens, full, 1024, torch.device("cpu"))
    plain, cal = Tail(*args), Tail(*args, heads)
    h = torch.randn(plain.n_reads, loaded.model.config.hidden_size)
    outs, recs = [], []
    with torch.inference_mode():
        for tail in (plain, cal):
            with Record() as rec:
                outs.append(tail(h))
            recs.append(rec.ops)
    assert recs[0] == recs[1] and len(recs[0]) >= 3, (recs[0], recs[1])
    assert recs[0][-1][0] in ("aten::matmul", "aten::mv", "aten::mm")  # the one product makes both blocks
    n = sum(plain.label_counts) * b
    (p_out, c_out) = outs
    assert p_out.shape == c_out.shape == (2 * n,)
    assert torch.equal(p_out[:n], c_out[:n])  # raw block: the same numbers
    assert torch.allclose(p_out[n:], p_out[:n], atol=1e-6, rtol=0)  # identity block without calibration
    t = torch.tensor([x for x, bias in affine for _ in bias] * b, dtype=torch.float64)
    bias = torch.tensor([v for _, bias in affine for v in bias] * b, dtype=torch.float64)
    want = (p_out[:n].double() + bias) / t
    assert torch.allclose(c_out[n:].double(), want, atol=1e-5, rtol=1e-6)


def test_tail_refuses_tables_of_the_wrong_size(tail_parts):
    layouts, loaded = tail_parts
    plans = [lay.plan for lay in layouts]
    tokens = sorted({t for p in plans for t in p.entry_token})
    with pytest.raises(ValueError, match=r"heads cover \[2, 2, 2\] labels per prompt"):
        Tail(plans, 1, loaded.head_rows(tokens), tokens, None, 1024, torch.device("cpu"),
             [PromptHead.temperature_bias(["x", "y"], 1.0, [0.0, 0.0])] * 3)


# ---- GPU: graphs and fp16 ------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("strategy", ["trie", "exact"])
def test_gpu_calibration_keeps_graphs_and_matches_reference(gpu_dirs, tmp_path_factory, strategy):
    """fp16 with CUDA graphs: as many graphs as without calibration, the reference's calibrated scores within
    the GPU tolerance, and still no allocation on the request path."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: run on a GPU machine")
    model_dir = gpu_dirs["qwen3"]
    prompts = [prompt("a", MULTI), prompt("b", SHARED, system="B?"), prompt("c", SINGLE, system="C?")]
    path = random_calibration(tmp_path_factory.mktemp("cal") / "cal.yaml", prompts, strategy, skip_last=False)
    cuda = {"device": "cuda"}
    fast = Classifier(tiny_cfg(model_dir, prompts, scoring={"name": strategy}, backend=cuda, calibration=path))
    plain = Classifier(tiny_cfg(model_dir, prompts, scoring={"name": strategy}, backend=cuda))
    ref = Classifier(tiny_cfg(model_dir, prompts, scoring={"name": strategy}, backend=cuda, calibration=path,
                              engine={"kind": "reference"}))

    def n_graphs(clf):
        return sum(len(bk.graphs) for bk in clf.engine.buckets.values() if bk.graphs)
    assert fast.engine.graphs and n_graphs(fast) == n_graphs(plain) > 0
    assert fast.metadata()["buckets"] == plain.metadata()["buckets"]
    for b in (1, 2, 3, 4):
        got, want = fast.classify(QUERIES[:b]), ref.classify(QUERIES[:b])
        for g, w in zip(got, want):
            for gp, wp in zip(g.prompts, w.prompts):
                d = max(abs(x.head_score - y.head_score) for x, y in zip(gp.labels, wp.labels))
                assert d <= TOL16, (strategy, g.query, gp.prompt, d)
                # winners must agree unless the reference's top two are closer than fp16 rounding can order
                for key, winner, ref_winner in (("head_score", gp.label, wp.label),
                                                ("score", gp.raw_label, wp.raw_label)):
                    top = sorted((getattr(x, key) for x in wp.labels), reverse=True)
                    if top[0] - top[1] > 2 * TOL16:
                        assert winner == ref_winner, (strategy, g.query, gp.prompt, key)
    fast.classify(QUERIES[:4])
    before = torch.cuda.memory_stats()
    for i in range(8):
        fast.classify(QUERIES[: 1 + i % 4])
    after = torch.cuda.memory_stats()
    assert after["allocation.all.allocated"] == before["allocation.all.allocated"]
