"""The fast engine equals the reference scorer (max |Δ| ≤ 1e-4 in fp32, identical winners)."""
from __future__ import annotations

import random

import pytest
import torch

from qcls.backends.registry import get_backend
from qcls.classifier import Classifier
from tests.conftest import prompt, tiny_cfg

TOL = 1e-4
# fp32 rounding grows with a score's size: an untrained tiny model over the real 152k Qwen vocabulary gives
# `exact` scores of -30 to -90 (5 tokens at ~-15 each), where the two paths differ by ~1.5e-6 relative
# (hidden states summed in another order). So the bound is 1e-4 for scores up to 10 and 1e-5 relative above.
REL = 1e-5


def tol(ref_score: float) -> float:
    return max(TOL, REL * abs(ref_score))
STRATEGIES = ["first_token", "trie", "exact", "mean_logprob"]
# Under the tiny byte tokenizer: 'man'/'manager' and 'boy'/'boys' are token-prefixes of each other,
# 'dress'/'dresses', 'tee'/'teen', 'knit'/'knitwear' share first tokens; SINGLE is all single tokens.
MULTI = ["man", "manager", "woman", "boy", "boys", "none"]
SHARED = ["dress", "dresses", "tee", "teen", "knit", "knitwear", "shirt", "none"]
SINGLE = ["women", "girl", "pregnant", "other", "trench"]
ZH = ["男童", "男士", "女童", "女士", "无", "连衣裙"]
QUERIES = ["mens slim fit jeans", "夏季女士碎花连衣裙", "hoodie", "red knit dress for a pregnant woman",
           "boys tee", "x", "连衣裙 👗 size M\x07"]


def pair(model_dir, prompts, strategy, loaded=None, **extra):
    """(fast, reference) classifiers sharing one loaded model (`loaded`: one the caller loaded for several
    pairs)."""
    fast_cfg = tiny_cfg(model_dir, prompts, scoring={"name": strategy}, **extra)
    ref_cfg = tiny_cfg(model_dir, prompts, scoring={"name": strategy}, engine={"kind": "reference"})
    loaded = get_backend("fp16").load(fast_cfg) if loaded is None else loaded
    return Classifier(fast_cfg, loaded=loaded), Classifier(ref_cfg, loaded=loaded)


def assert_same(fast, ref, queries, bound: float = TOL):
    """|Δ score| within `bound` (scaled as `tol` scales TOL above 10), identical winners; returns the worst."""
    got, want = fast.classify(queries), ref.classify(queries)
    worst = 0.0
    for g, w in zip(got, want):
        assert g.error == w.error
        for gp, wp in zip(g.prompts, w.prompts):
            d = max(abs(a.score - b.score) / tol(b.score) * TOL for a, b in zip(gp.labels, wp.labels))
            worst = max(worst, d)
            assert d <= bound, (g.query, gp.prompt, d)
            assert gp.label == wp.label
    return worst


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "llama", "gemma3"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_families_and_strategies(tiny_dirs, family, strategy):
    prompts = [prompt("audience", MULTI), prompt("category", SHARED, system="Category?"),
               prompt("single", SINGLE, system="Single?")]
    if strategy == "first_token":  # shared first tokens cannot be told apart there: single-token-first sets
        prompts = [prompt("single", SINGLE), prompt("first", ["man", "woman", "boy", "girl", "none"])]
    fast, ref = pair(tiny_dirs[family], prompts, strategy)
    assert_same(fast, ref, QUERIES[:4])


@pytest.mark.parametrize("strategy", ["trie", "exact"])
def test_batch_sizes_and_mixed_lengths(tiny_dirs, strategy):
    fast, ref = pair(tiny_dirs["qwen3"], [prompt("a", MULTI), prompt("b", SHARED, system="B?")], strategy)
    rng = random.Random(0)
    words = "red blue slim fit jeans dress 女士 连衣裙 boys hoodie cotton summer".split()
    for b in (1, 2, 3, 4):
        queries = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 9))) for _ in range(b)]
        got = fast.classify(queries)
        assert {r.batch_size for r in got} == {b}
        assert_same(fast, ref, queries)


def test_results_do_not_depend_on_batch_mates(tiny_dirs):
    fast, _ = pair(tiny_dirs["llama"], [prompt("a", MULTI), prompt("b", SHARED, system="B?")], "trie")
    alone = [fast.classify([q])[0] for q in QUERIES[:4]]
    together = fast.classify(QUERIES[:4])
    for a, t in zip(alone, together):
        for pa, pt in zip(a.prompts, t.prompts):
            assert max(abs(x.score - y.score) for x, y in zip(pa.labels, pt.labels)) <= TOL


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_eight_prompts_real_qwen_tokenizer(tiny_dirs, strategy):
    """8 prompts with Chinese multi-token labels (shared first tokens under Qwen's vocabulary)."""
    zh = ["连衣裙", "牛仔裤", "衬衫", "风衣", "半身裙", "T恤", "卫衣", "针织衫", "其他", "无"]
    aud = ["男童", "女童", "男士", "女士", "孕妇", "无"]
    en = ["dress", "jeans", "shirt", "tee", "hoodie", "none"]
    prompts = [prompt(f"p{i}", labels, system=f"Task {i}: pick one.") for i, labels in
               enumerate([en, zh, aud, en[:4], zh[:5], aud[:3], ["man", "woman", "none"], en])]
    if strategy == "first_token":
        prompts = [p for p in prompts if not any("\u4e00" <= c <= "\u9fff" for c in "".join(p["labels"]))]
        prompts = prompts + [prompt("extra", ["boy", "girl", "none"], system="Extra.")]
    fast, ref = pair(tiny_dirs["qwen3_qwentok"], prompts, strategy, engine={"max_batch_size": 2})
    assert len(prompts) >= 5
    assert_same(fast, ref, ["夏季女士碎花连衣裙", "mens slim fit jeans", "孕妇装 dress"])


def test_shared_prefix_blocks_are_stored_once(tiny_dirs):
    header = "You classify e-commerce search queries for a large online fashion store. " * 3
    prompts = [prompt("a", MULTI, system=header + "Audience?"), prompt("b", SHARED, system=header + "Category?"),
               prompt("c", SINGLE, system=header + "Other?")]
    fast, ref = pair(tiny_dirs["qwen3"], prompts, "trie", engine={"prefix_block_size": 4})
    stats = fast.metadata()["prefix_cache"]
    assert stats["shared_blocks"] > 0 and stats["tokens_saved"] > 0
    assert stats["slots"] == stats["prefix_tokens"] - stats["tokens_saved"]
    assert_same(fast, ref, QUERIES[:3])


def test_template_with_empty_suffix(tiny_dirs):
    """The root is then the last query token: left-padding keeps it at a fixed slot."""
    p = {"name": "tail", "template": "<|im_start|>user\nClassify: {query}", "labels": MULTI}
    fast, ref = pair(tiny_dirs["qwen2"], [p], "trie")
    assert_same(fast, ref, ["a", "longer query with more words"])


def test_first_token_collision_refused_before_weights_load(tiny_dirs, monkeypatch):
    from qcls.backends.fp16 import Fp16Backend

    def no_weights(self, cfg):
        raise AssertionError("weights were loaded before the label sets were checked")
    monkeypatch.setattr(Fp16Backend, "load", no_weights)
    cfg = tiny_cfg(tiny_dirs["qwen3"], [prompt("c", SHARED)], force_single_token_labels=True)
    with pytest.raises(ValueError, match=r"share first token .*scoring=trie"):
        Classifier(cfg)


def test_bad_queries_fail_alone(tiny_dirs):
    fast, _ = pair(tiny_dirs["qwen3"], [prompt("a", MULTI)], "trie")
    res = fast.classify(["ok query", "", "word " * 40, "  "])
    assert res[0].ok and res[0].prompts
    assert "empty query" in res[1].error and "empty query" in res[3].error
    assert "max_query_tokens=16" in res[2].error and not res[2].prompts


def test_stage_timings_add_up(tiny_dirs):
    fast, _ = pair(tiny_dirs["qwen3"], [prompt("a", MULTI)], "trie")
    r = fast.classify(["red dress"])[0]
    t = r.timings_ms
    assert set(t) == {"tokenize", "prepare", "forward", "score", "postprocess", "total"}
    assert abs(sum(v for k, v in t.items() if k != "total") - t["total"]) < 1e-3
    assert r.meta["tokens_per_forward"] > 0


def test_two_batches_in_flight_equal_one_at_a_time(tiny_dirs):
    """A server starts the next batch before finishing the current one (Classifier.start / finish): two in
    flight, in the same bucket and in different ones, give the scores of classify on each alone."""
    fast, ref = pair(tiny_dirs["qwen3"], [prompt("a", MULTI), prompt("b", SHARED, system="B?")], "trie")
    # start-up measured every batch size's device time (a server times its next batch by it)
    assert sorted(fast.device_ms) == [1, 2, 3, 4] and all(ms > 0 for ms in fast.device_ms.values())
    for first, second in ([QUERIES[0:2], QUERIES[2:4]], [QUERIES[:1], QUERIES[1:4]], [["boys tee"], ["hoodie"]]):
        a, b = fast.start(first), fast.start(second)
        with pytest.raises(RuntimeError, match="already in flight"):
            fast.start(["one too many"])
        got = fast.finish(a) + fast.finish(b, wait_is_queue=True)
        want = ref.classify(first) + ref.classify(second)
        for g, w in zip(got, want):
            for gp, wp in zip(g.prompts, w.prompts):
                assert max(abs(x.score - y.score) for x, y in zip(gp.labels, wp.labels)) <= TOL, (g.query, gp.prompt)
                assert gp.label == wp.label
        t = got[-1].timings_ms  # the device wait is kept out of the stages, which still add up
        assert t["device_wait"] >= 0 and abs(sum(t[k] for k in STAGE_KEYS) - t["total"]) < 1e-3
    with pytest.raises(ValueError, match="at most engine.max_batch_size=4"):
        fast.start(QUERIES[:5])
    assert [r.ok for r in fast.finish(fast.start(["", "ok"]))] == [False, True]  # a refused query takes no slot
    assert fast.finish(fast.start([""]))[0].error  # nothing to run: no forward at all


STAGE_KEYS = ("tokenize", "prepare", "forward", "score", "postprocess")


# one worker runs all four: their reference forwards are the same, computed once there (conftest's memo)
@pytest.mark.slow
@pytest.mark.xdist_group("smollm2-reference")
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_demo_model(demo_cfg_overrides, strategy):
    """Real weights and tokenizer: the mission's two prompts (' tee' and ' hoodie' are two tokens there), scored by
    the LLM itself (calibration=null: the demo's head would stop the forward before any label is scored)."""
    from qcls.config.compose import compose
    over = demo_cfg_overrides + [f"scoring={strategy}", "calibration=null"]
    fast = Classifier(compose(over))
    ref = Classifier(compose(over + ["engine=reference"]), loaded=fast.loaded)
    assert_same(fast, ref, ["mens slim fit jeans", "boys hoodie", "summer tee"])


needs_triton = pytest.mark.skipif(__import__("qcls.engine.attention", fromlist=["triton"]).triton is None,
                                  reason="Triton is not installed: the tree-attention kernel cannot run")


@pytest.mark.slow
@needs_triton
@pytest.mark.parametrize("family,strategy,fused", [("qwen3", "trie", False), ("llama", "exact", False),
                                                   ("qwen2", "mean_logprob", False), ("qwen3", "trie", True),
                                                   ("gemma3", "trie", True), ("llama", "exact", True)])
def test_tree_attention_engine(tiny_dirs, family, strategy, fused):
    """The whole engine with the tree-attention kernel (Triton's interpreter on a CPU): batches 1–4; with the
    q/k/v work inside the attention kernels (engine.fuse_qkv_attention, the default) and without it, for
    q/k-normed (Qwen3, Gemma3's 1 + w) and plain (Llama) heads."""
    prompts = [prompt("a", MULTI), prompt("b", SHARED, system="B?"), prompt("c", SINGLE, system="C?"),
               {"name": "bare", "template": "{query} is a", "labels": SHARED}]  # no prefix to attend to
    fast, ref = pair(tiny_dirs[family], prompts, strategy, engine={"attention": "tree", "fuse_qkv_attention": fused})
    assert fast.metadata()["attention"] == "tree"
    assert fast.engine.dec.fuse_qkv_attention is bool(fused)
    for b in (1, 4, 2):
        assert_same(fast, ref, QUERIES[:b])


@pytest.mark.slow
@needs_triton
def test_tree_attention_engine_split_prefixes(tiny_dirs, monkeypatch):
    """Prefixes split into chunks of 16 keys (partial softmax states merged per tile), chunk boundaries
    inside a header that three prompts share (blocks of 8), one prompt without a prefix: batches 1–4."""
    from qcls.engine import bucket as E  # (where the buckets look up their tuning)
    from qcls.engine.tree_plan import Tuning
    forced = Tuning(inline_reads=0, min_chunk=16, max_chunk=16, partial_limit=1e9, bq=16, qb=2, bn=16, row_bn=16)
    monkeypatch.setattr(E, "tuning_for", lambda *a, **k: forced)
    header = "You classify e-commerce search queries for a large online fashion store. "
    prompts = [prompt("a", MULTI, system=header + "Audience?"), prompt("b", SHARED, system=header + "Category?"),
               prompt("c", SINGLE, system=header + "Other?"), {"name": "bare", "template": "{query} is a",
                                                              "labels": SHARED}]
    fast, ref = pair(tiny_dirs["qwen3"], prompts, "trie", engine={"attention": "tree", "prefix_block_size": 8})
    assert fast.metadata()["prefix_cache"]["shared_blocks"] > 0
    plans = [bk.tree for bk in fast.engine.buckets.values()]
    assert all(p.work.shape[0] and p.max_splits > 1 for p in plans)
    assert any(c.hi - c.lo == 3 for c in plans[0].chunks)  # a chunk of the shared header, read once for all three
    for b in (1, 4, 3):
        assert_same(fast, ref, QUERIES[:b])


@pytest.mark.slow
@needs_triton
def test_tree_attention_eight_prompts_real_qwen_tokenizer(tiny_dirs):
    zh = ["连衣裙", "牛仔裤", "衬衫", "风衣", "半身裙", "T恤", "卫衣", "针织衫", "其他", "无"]
    aud = ["男童", "女童", "男士", "女士", "孕妇", "无"]
    en = ["dress", "jeans", "shirt", "tee", "hoodie", "none"]
    prompts = [prompt(f"p{i}", labels, system=f"Task {i}: pick one.") for i, labels in
               enumerate([en, zh, aud, en[:4], zh[:5], aud[:3], ["man", "woman", "none"], en])]
    fast, ref = pair(tiny_dirs["qwen3_qwentok"], prompts, "trie", engine={"attention": "tree", "max_batch_size": 2})
    assert_same(fast, ref, ["夏季女士碎花连衣裙", "mens slim fit jeans"])


def test_attention_auto_is_dense_on_cpu(tiny_dirs):
    fast, _ = pair(tiny_dirs["qwen3"], [prompt("a", MULTI)], "trie")
    assert fast.metadata()["attention"] == "sdpa" and not fast.notes


def test_attention_tree_refused_where_it_cannot_run(tiny_dirs, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # a CPU without the interpreter: no kernel to run
    cfg = tiny_cfg(tiny_dirs["qwen3"], [prompt("a", MULTI)], engine={"attention": "tree"})
    with pytest.raises(ValueError, match=r"engine.attention=tree cannot run: .*use engine.attention=auto or sdpa"):
        Classifier(cfg)


@pytest.mark.slow
@needs_triton
@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_tree_attention_fused_qkv_with_separate_projection_modules(tiny_dirs, family):
    """engine.fuse_qkv_attention where q, k and v come from three modules rather than one fused GEMM (what a
    quantized or streamed backend's layers give): three tensors with their own row strides, against the
    reference (Triton's interpreter on a CPU)."""
    from torch import nn

    class Separate(nn.Linear):  # not a plain nn.Linear: the decoder calls it as a module (decoder._fuse_linears)
        pass

    prompts = [prompt("a", MULTI), prompt("b", SHARED, system="B?")]
    fast_cfg = tiny_cfg(tiny_dirs[family], prompts, scoring={"name": "trie"},
                        engine={"attention": "tree", "fuse_qkv_attention": True})
    loaded = get_backend("fp16").load(fast_cfg)
    for layer in loaded.model.model.layers:
        old = layer.self_attn.q_proj
        new = Separate(old.in_features, old.out_features, bias=old.bias is not None)
        new.load_state_dict(old.state_dict())
        layer.self_attn.q_proj = new
    fast = Classifier(fast_cfg, loaded=loaded)
    ref = Classifier(tiny_cfg(tiny_dirs[family], prompts, scoring={"name": "trie"}, engine={"kind": "reference"}),
                     loaded=loaded)
    assert all(q is None for q in fast.engine.dec.qkv) and fast.engine.dec.fuse_qkv_attention
    for b in (1, 3):
        assert_same(fast, ref, QUERIES[:b])
