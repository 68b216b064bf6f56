"""What the playground shows of a served prompt set (GET /v1/check): the facts `qcls check` computes from the config
and tokenizer, read here from a running Classifier's own layouts, with the T4 projection of docs/design.md §8."""
from __future__ import annotations

import pytest

from qcls.backends.memory import param_counts
from qcls.check.report import build
from qcls.check.served import served_check, t4_ms
from qcls.scoring.tokenization import encode
from tests.check.test_report import PROMPTS
from tests.conftest import tiny_cfg


def test_a_served_prompt_set_has_the_facts_qcls_check_reports(tiny_dirs):
    from qcls.classifier import Classifier
    cfg = tiny_cfg(tiny_dirs["qwen3_qwentok"], PROMPTS, engine={"max_batch_size": 2})
    clf = Classifier(cfg)
    rep = build(cfg, query_tokens=5)
    got = served_check(clf, query_tokens=5)
    assert got["fingerprint"] == clf.fingerprint and got["prefix_pool_tokens"] == rep.prefix_pool_tokens
    assert [(f["batch"], f["tokens"], f["bucket_tokens"]) for f in got["forward"]] == [
        (f.batch, f.tokens, f.bucket_tokens) for f in rep.forward]
    for mine, theirs, spec in zip(got["prompts"], rep.prompts, cfg.prompts):
        assert (mine["name"], mine["template"], mine["label_prefix"]) == (spec.name, spec.template, spec.label_prefix)
        for key in ("prefix_tokens", "shared_prefix_tokens", "suffix_tokens", "row_trie_tokens", "end_token"):
            assert mine[key] == getattr(theirs, key), key
        assert [(lab["label"], lab["tokens"], lab["trie_reads"]) for lab in mine["labels"]] == [
            (lab.label, lab.tokens, lab.trie_reads) for lab in theirs.labels]
    # " t-shirt" and " tshirt" start with the same token " t"; "trench coat" starts as "trench" does
    firsts = {lab: encode(clf.tokenizer, " " + lab)[0] for lab in cfg.prompts[0].labels}
    for lab in got["prompts"][0]["labels"]:
        assert lab["shares_first_token"] == [o for o in cfg.prompts[0].labels
                                             if o != lab["label"] and firsts[o] == firsts[lab["label"]]]
    assert any(lab["shares_first_token"] for lab in got["prompts"][0]["labels"])
    pc = param_counts(clf.loaded.source_config)  # every layer runs (no head stops the forward)
    params = pc.layers * (pc.layer_linear + pc.layer_other)
    assert [f["t4_ms"] for f in got["forward"]] == [round(t4_ms(params, f["tokens"]), 2) for f in got["forward"]]


def test_the_t4_projection_is_the_benchmarks_formula():
    common = pytest.importorskip("bench.common")
    # Qwen3-4B's decoder layers: 3.6e9 parameters, 7.27 GB in fp16 (docs/design.md §8)
    for tokens in (32, 126, 440):
        assert t4_ms(3_635_000_000, tokens) == pytest.approx(common.t4_projection(2 * 3_635_000_000, 3_635_000_000,
                                                                                  tokens))
    assert t4_ms(3_635_000_000, 126) == pytest.approx(58, abs=2)  # ≈ 30 ms of weight read + ≈ 28 ms of GEMMs
