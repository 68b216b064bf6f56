"""The configuration fingerprint: it changes with what changes answers, and only with that."""
from __future__ import annotations

from qcls.results.answer_fingerprint import answer_fingerprint
from qcls.config.compose import compose


def test_the_fingerprint_follows_what_changes_answers(tmp_path):
    base = compose([])
    fp = answer_fingerprint(base, None)
    assert len(fp) == 12 and fp == answer_fingerprint(compose([]), None)  # stable across processes and calls
    for same in (["serve.port=9000", "serve.num_replicas=2"], ["engine.max_batch_size=8"], ["max_query_tokens=32"],
                 ["engine.result_cache_entries=0"]):
        assert answer_fingerprint(compose(same), None) == fp, same
    for other in (["prompts=default_fewshot"], ["scoring=exact"], ["model=smollm2_demo"], ["backend.dtype=float16"],
                  ["engine=reference"]):
        assert answer_fingerprint(compose(other), None) != fp, other
    head = tmp_path / "head.yaml"
    head.write_text("a: 1\n")
    with_head = answer_fingerprint(base, str(head))
    assert with_head != fp
    head.write_text("a: 2\n")  # refitted in place: another configuration
    assert answer_fingerprint(base, str(head)) != with_head
