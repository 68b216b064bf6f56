"""GPU (fp16, CUDA graphs): the engine matches the reference (max |Δ| ≤ 3e-2, same winners), nothing is
allocated or captured on the request path, and the first request is warm. Run with `pytest -m gpu`."""
from __future__ import annotations

import pytest
import torch

from qcls.classifier import Classifier
from tests.conftest import prompt, tiny_cfg
from tests.engine.test_equivalence import MULTI, QUERIES, SHARED, SINGLE

pytestmark = pytest.mark.gpu
TOL16 = 3e-2


@pytest.fixture(autouse=True)
def _need_cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: run on a GPU machine")


@pytest.fixture(scope="module")
def gpu_dirs(tiny_dirs, tmp_path_factory):
    """The tiny checkpoints with logits tempered to a real model's range (final norm weight × 0.25, which
    scales every logit by 0.25). Untempered, their logits reach ±40, where fp16 rounding of a single logit
    is ~0.03: the 3e-2 tolerance would then measure fp16 itself, not the engine."""
    import shutil

    from safetensors.torch import load_file, save_file
    out = {}
    for name, path in tiny_dirs.items():
        dst = tmp_path_factory.mktemp(f"gpu_{name}")
        shutil.copytree(path, dst, dirs_exist_ok=True)
        f = dst / "model.safetensors"
        w = load_file(f)
        w["model.norm.weight"] = w["model.norm.weight"] * 0.25
        save_file(w, f, metadata={"format": "pt"})
        out[name] = str(dst)
    return out


def fp16_pair(model_dir, prompts, strategy, attention="auto"):
    """Fast engine (packed, fused kernels, graphs) vs the reference (plain transformers forwards), both in
    fp16 on the GPU on the same weights."""
    fast_cfg = tiny_cfg(model_dir, prompts, scoring={"name": strategy}, backend={"device": "cuda"},
                        engine={"attention": attention})
    ref_cfg = tiny_cfg(model_dir, prompts, scoring={"name": strategy}, engine={"kind": "reference"},
                       backend={"device": "cuda"})
    return Classifier(fast_cfg), Classifier(ref_cfg)


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "llama", "qwen3_qwentok"])
@pytest.mark.parametrize("strategy", ["first_token", "trie", "exact", "mean_logprob"])
@pytest.mark.parametrize("attention", ["tree", "sdpa"])
def test_fp16_graphs_match_reference(gpu_dirs, family, strategy, attention):
    prompts = [prompt("a", MULTI), prompt("b", SHARED, system="B?"), prompt("c", SINGLE, system="C?")]
    if family == "qwen3_qwentok":
        prompts = [prompt("zh", ["男童", "女童", "男士", "女士", "孕妇", "无"]), prompt("en", ["dress", "jeans", "none"])]
    if strategy == "first_token":
        prompts = [prompt("c", SINGLE), prompt("d", ["man", "woman", "boy", "girl", "none"], system="D?")]
    fast, ref = fp16_pair(gpu_dirs[family], prompts, strategy, attention)
    assert fast.engine.graphs and fast.loaded.dtype == torch.float16 and fast.metadata()["attention"] == attention
    for b in (1, 2, 3, 4):
        got, want = fast.classify(QUERIES[:b]), ref.classify(QUERIES[:b])
        for g, w in zip(got, want):
            for gp, wp in zip(g.prompts, w.prompts):
                d = max(abs(x.score - y.score) for x, y in zip(gp.labels, wp.labels))
                assert d <= TOL16, (family, strategy, g.query, gp.prompt, d)
                assert gp.label == wp.label


@pytest.mark.parametrize("strategy", ["trie", "exact"])
def test_fp16_graphs_split_prefixes_match_reference(gpu_dirs, strategy, monkeypatch):
    """Every prefix split into chunks of 16 keys (prefix kernel + merged partial states, inside the CUDA
    graphs), a header three prompts share, one prompt without a prefix: batches 1–4 equal the reference."""
    from qcls.engine import bucket as E  # (where the buckets look up their tuning)
    from qcls.engine.tree_plan import tuning_for
    shipped = tuning_for
    monkeypatch.setattr(E, "tuning_for", lambda *a: shipped(*a).with_(inline_reads=0, min_chunk=16, max_chunk=16,
                                                                       partial_limit=1e9))
    header = "You classify e-commerce search queries for a large online fashion store. "
    prompts = [prompt("a", MULTI, system=header + "Audience?"), prompt("b", SHARED, system=header + "Category?"),
               prompt("c", SINGLE, system=header + "Other?"), {"name": "bare", "template": "{query} is a",
                                                              "labels": SHARED}]
    fast, ref = fp16_pair(gpu_dirs["qwen3"], prompts, strategy, "tree")
    assert fast.engine.graphs and all(bk.tree.work.shape[0] for bk in fast.engine.buckets.values())
    for b in (1, 2, 3, 4):
        got, want = fast.classify(QUERIES[:b]), ref.classify(QUERIES[:b])
        for g, w in zip(got, want):
            for gp, wp in zip(g.prompts, w.prompts):
                assert max(abs(x.score - y.score) for x, y in zip(gp.labels, wp.labels)) <= TOL16, (g.query, gp.prompt)
                assert gp.label == wp.label


@pytest.mark.parametrize("family", ["qwen3", "qwen3_qwentok"])
def test_two_batches_in_flight_match_reference(gpu_dirs, family):
    """Batch 2 queued behind batch 1 on the device (same bucket, then another), collected in order: each
    equals the reference, so the host slots and the static buffers do not leak between them."""
    prompts = [prompt("a", MULTI), prompt("b", SHARED, system="B?")]
    fast, ref = fp16_pair(gpu_dirs[family], prompts, "trie")
    for first, second in ([QUERIES[0:2], QUERIES[2:4]], [QUERIES[:1], QUERIES[1:4]], [["boys tee"], ["hoodie"]]):
        a, b = fast.start(first), fast.start(second)
        got = fast.finish(a) + fast.finish(b, wait_is_queue=True)
        for g, w in zip(got, ref.classify(first) + ref.classify(second)):
            for gp, wp in zip(g.prompts, w.prompts):
                assert max(abs(x.score - y.score) for x, y in zip(gp.labels, wp.labels)) <= TOL16, (g.query, gp.prompt)
                assert gp.label == wp.label


def test_no_allocation_or_capture_on_request_path(tiny_dirs, monkeypatch):
    cfg = tiny_cfg(tiny_dirs["qwen3"], [prompt("a", MULTI), prompt("b", SHARED, system="B?")],
                   backend={"device": "cuda"})
    clf = Classifier(cfg)
    assert clf.metadata()["attention"] == "tree" and not clf.notes  # auto takes the kernel on a GPU

    def no_capture(*_a, **_k):
        raise AssertionError("a CUDA graph was captured on the request path")
    monkeypatch.setattr(torch.cuda, "CUDAGraph", no_capture)
    # warm from the first request: it neither captures nor allocates (checked by what it does, not by how long
    # it takes, which a busy machine would make flaky)
    before = torch.cuda.memory_stats()
    [first] = clf.classify(["first request"])
    assert first.ok and first.meta["graphs"]
    for i in range(20):
        clf.classify(["red dress", "boys hoodie size 140", "x", "夏季女士碎花连衣裙"][: 1 + i % 4])
    after = torch.cuda.memory_stats()
    before_pipelined = torch.cuda.memory_stats()
    for i in range(10):  # two batches in flight, as a replica runs them
        a, b = clf.start(["red dress", "x"][: 1 + i % 2]), clf.start(["boys hoodie size 140"])
        clf.finish(a), clf.finish(b, wait_is_queue=True)
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before_pipelined["allocation.all.allocated"]
    assert after["allocation.all.allocated"] == before["allocation.all.allocated"]
    assert after["segment.all.allocated"] == before["segment.all.allocated"]


@pytest.fixture(scope="module")
def sharp_dir(tmp_path_factory):
    """A deeper random Qwen3 (8 layers, hidden 256) with the final norm ×4: logits about as large as a trained
    model's (top logits ~30), so fp16 rounding shows in the scores."""
    from qcls.testing.tiny_models import make_tiny_model_dir, tiny_byte_tokenizer
    d = make_tiny_model_dir(tmp_path_factory.mktemp("sharp") / "qwen3", "qwen3", tiny_byte_tokenizer(), seed=3,
                            hidden_size=256, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=64, intermediate_size=768)
    from safetensors.torch import load_file, save_file
    f = d / "model.safetensors"
    w = load_file(f)
    w["model.norm.weight"] = w["model.norm.weight"] * 4
    save_file(w, f, metadata={"format": "pt"})
    return str(d)


@pytest.mark.parametrize("strategy", ["trie", "exact", "mean_logprob"])
def test_fast_fp16_is_as_close_to_fp32_as_transformers_fp16(sharp_dir, strategy):
    """|Δ score| against the fp32 reference: the fast fp16 engine's mean ≤ transformers' own fp16 forward's (the
    reference scorer on the fp16 model), and it keeps the fp32 winner wherever transformers does. The mean, not
    the max: on a small model the largest of ~150 errors is a coin flip between two paths of similar error
    (on Qwen3-4B the max is in bench/RESULTS.md, "fidelity")."""
    prompts = [prompt("a", MULTI), prompt("b", SHARED, system="B?"), prompt("c", SINGLE, system="C?")]
    cuda = {"device": "cuda"}
    fast = Classifier(tiny_cfg(sharp_dir, prompts, scoring={"name": strategy}, backend=cuda))
    hf16 = Classifier(tiny_cfg(sharp_dir, prompts, scoring={"name": strategy}, backend=cuda,
                               engine={"kind": "reference"}))
    fp32 = Classifier(tiny_cfg(sharp_dir, prompts, scoring={"name": strategy},
                               backend={"device": "cuda", "dtype": "float32"}, engine={"kind": "reference"}))
    queries = QUERIES + ["slim fit jeans for men", "女士 连衣裙 夏季", "boys hoodie size 140", "red knit"]
    got, hf, truth = fast.classify(queries), hf16.classify(queries), fp32.classify(queries)
    e_fast, e_hf = [], []
    for g, h, t in zip(got, hf, truth):
        for gp, hp, tp in zip(g.prompts, h.prompts, t.prompts):
            want = [x.score for x in tp.labels]
            e_fast += [abs(x.score - y) for x, y in zip(gp.labels, want)]
            e_hf += [abs(x.score - y) for x, y in zip(hp.labels, want)]
            if hp.label == tp.label:
                assert gp.label == tp.label, (strategy, g.query, gp.prompt)
    mean_fast, mean_hf = sum(e_fast) / len(e_fast), sum(e_hf) / len(e_hf)
    print(f"{strategy}: |Δ score| vs fp32, mean / max: fast fp16 {mean_fast:.4f} / {max(e_fast):.4f}, "
          f"transformers fp16 {mean_hf:.4f} / {max(e_hf):.4f}")
    assert mean_hf > 0 and mean_fast <= mean_hf, (mean_fast, mean_hf)
