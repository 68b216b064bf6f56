"""`qcls label-next`: the choice on synthetic probabilities and states (margin, diversity, coverage, frequency),
every bad input refused before the model loads with the file and the way out, and one run on a tiny model
with a head for one prompt and the LLM's scores for the other."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from transformers import AutoModelForCausalLM

from qcls.cli import main
from qcls.fitting.label_next import Candidates, choose, margins, unit_states
from qcls.eval.metrics import softmax
from tests.eval.sweep_helpers import tiny, write_set


def cands(probs: dict[str, list], states, counts=None) -> Candidates:
    p = {k: np.array(v, dtype=float) for k, v in probs.items()}
    n = len(next(iter(p.values())))
    return Candidates([f"q{i}" for i in range(n)], np.array(counts or [1] * n, dtype=float), p,
                      {k: [f"l{j}" for j in range(v.shape[1])] for k, v in p.items()}, {}, np.array(states, float))


EYE = np.eye(4)  # four queries whose states are orthogonal: diversity never skips one


def test_the_smallest_margin_over_the_prompts_comes_first_or_one_prompts():
    c = cands({"a": [[.5, .5], [.9, .1], [.6, .4], [.99, .01]], "b": [[.9, .1], [.55, .45], [.9, .1], [.7, .3]]}, EYE)
    assert margins(c.probs["a"]) == pytest.approx([0, .8, .2, .98])
    picks = choose(c, 4, coverage=0)
    assert [p.index for p in picks] == [0, 1, 2, 3]  # min margins 0, .1, .2, .4
    assert picks[1].why == "margin 0.100 on b" and picks[1].kind == "uncertainty"
    assert picks[1].margins == {"a": pytest.approx(.8), "b": pytest.approx(.1)}
    assert [p.index for p in choose(c, 2, prompt="a", coverage=0)] == [0, 2]


def test_near_identical_states_are_not_both_picked_unless_nothing_else_is_left():
    states = [[1, 0, 0], [1, 0.01, 0], [0, 1, 0], [0, 0, 1]]
    c = cands({"a": [[.5, .5], [.51, .49], [.8, .2], [.9, .1]]}, unit_states([np.array(states)]))
    assert [p.index for p in choose(c, 2, coverage=0)] == [0, 2]  # 1 is 0's twin
    assert [p.index for p in choose(c, 4, coverage=0)] == [0, 2, 3, 1]  # asked for all: the twin comes last


def test_frequency_weighting_changes_the_order():
    c = cands({"a": [[.5, .5], [.7, .3]]}, EYE[:2], counts=[1, 50])
    assert [p.index for p in choose(c, 2, coverage=0)] == [0, 1]
    picks = choose(c, 2, coverage=0, by_frequency=True)  # (1 - 0.4) · log 51 > 1 · log 2
    assert [p.index for p in picks] == [1, 0] and "asked 50×" in picks[0].why


def test_coverage_takes_the_query_farthest_from_the_labelled_and_interleaves():
    c = cands({"a": [[.5, .5], [.6, .4], [.99, .01], [.7, .3]]}, [[1, 0, 0], [.8, .6, 0], [0, 0, 1], [.6, .8, 0]])
    labelled = np.array([[0, 1, 0]])  # 1 and 3 are near it or near 0 (picked first, by margin); 2 is near neither
    picks = choose(c, 2, labelled, coverage=0.5, similarity=1.0)
    assert [p.kind for p in picks] == ["uncertainty", "coverage"]
    assert picks[0].index == 0 and picks[1].index == 2 and picks[1].why.startswith("coverage: similarity")
    with pytest.raises(ValueError, match="candidates"):
        choose(c, 5)


def test_unit_states_standardise_each_prompt_and_weigh_prompts_alike():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(6, 3)) * [1e5, 1, 1] + 1e5, rng.normal(size=(6, 2))  # one huge shared dimension
    u = unit_states([a, b])
    assert u.shape == (6, 5) and np.allclose(np.linalg.norm(u, axis=1), 1)
    assert np.allclose(np.linalg.norm(u[:, :3], axis=1), np.sqrt(.5))


def test_the_pool_is_distinct_queries_with_counts_from_a_file_a_bulk_output_or_a_log(tmp_path):
    from qcls.bulk.pool import read_pool
    (tmp_path / "q.txt").write_text("red dress\nRed  Dress\nred dress\n\njeans\n", encoding="utf-8")
    pool = read_pool(tmp_path / "q.txt")
    assert (pool.queries, pool.counts, pool.kind, pool.rows, pool.skipped) == (["red dress", "jeans"], [3, 1],
                                                                               "query file", 5, 1)
    (tmp_path / "bulk.csv").write_text("q,pred:category,error\njeans,jeans,\nhoodie,hoodie,\njeans,jeans,\n")
    pool = read_pool(tmp_path / "bulk.csv", column="q")
    assert (pool.queries, pool.counts, pool.kind) == (["jeans", "hoodie"], [2, 1], "predictions file")
    log = tmp_path / "log"
    log.mkdir()
    rows = [{"time": "t", "query": q, "fingerprint": f, "pred:category": "x"} for q, f in
            (("boys hoodie", "a"), ("maxi dress", "a"), ("Boys hoodie", "b"))]  # two configurations: normal
    for i, r in enumerate(rows):
        (log / f"part-{i}.jsonl").write_text(json.dumps(r) + "\n")
    (log / "notes.txt").write_text("not a part")
    pool = read_pool(log)
    assert (pool.queries, pool.counts, pool.kind, len(pool.files)) == (["boys hoodie", "maxi dress"], [2, 1],
                                                                       "prediction log", 3)


LOG_ROW = json.dumps({"time": "t", "query": "red dress", "pred:category": "dress"})


@pytest.mark.parametrize("files,args,says", [
    ({"log/a.jsonl": LOG_ROW + "\n" + LOG_ROW[:20] + "\n"}, ["log"], ["a.jsonl line 2", "cut short", "move"]),
    ({"log/a.jsonl": LOG_ROW + "\n", "log/b.jsonl": '{"query": "x", "labels": {}}\n'}, ["log"],
     ["b.jsonl is not a prediction-log part", "move"]),
    ({"log/readme.txt": "x"}, ["log"], ["without prediction-log parts", "the folder the prediction log writes to"]),
    ({"p.txt": "red dress\n", "l.csv": "query,pred:category\nred dress,dress\n"}, ["p.txt", "--labelled", "l.csv"],
     ["l.csv: the header", "what qcls answered", "label-next"]),
    ({"p.txt": "red dress\n", "l.csv": "query,category\nred dress,gown\n"}, ["p.txt", "--labelled", "l.csv"],
     ["l.csv: row 2", "'gown'", "not one of its labels"]),
    ({"p.txt": "red dress\n", "l.csv": "query,category\nred dress,dress\nred dress,dress\n"},
     ["p.txt", "--labelled", "l.csv"], ["l.csv: row 3", "duplicate query"]),
    ({"p.txt": "red dress\njeans\n"}, ["p.txt", "-n", "3"], ["-n 3", "p.txt has 2 queries", "-n 2 or fewer"]),
    ({"p.txt": "red dress\n", "l.csv": "query,category\nRed Dress,dress\n"}, ["p.txt", "--labelled", "l.csv"],
     ["every query of the pool p.txt", "already in l.csv", "a newer log"]),
    ({"p.txt": "red dress\n", "label_next.csv": "query,category\nred dress,dress\n"}, ["p.txt"],
     ["label_next.csv exists", "never overwrites", "another --out"]),
    ({"p.csv": "q\nred dress\n"}, ["p.csv"], ["p.csv line 1", "no column 'query'", "--column"]),
])
def test_bad_input_is_refused_before_the_model_loads(tmp_path, monkeypatch, capsys, files, args, says):
    monkeypatch.chdir(tmp_path)
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    before = {n: (tmp_path / n).read_bytes() for n in files}
    assert main(["label-next", *args]) == 2
    err = capsys.readouterr().err
    assert all(s in err for s in says), err
    assert {n: (tmp_path / n).read_bytes() for n in files} == before  # nothing written over
    assert not (tmp_path / "label_next.csv").exists() or "label_next.csv" in files


@pytest.fixture(scope="module")
def category_head(tiny_dirs, tmp_path_factory):
    """A head of the tiny Qwen3 for `category` alone (random weights on the state after layer 1): `audience`
    keeps the LLM's label scores, a cold start."""
    from qcls.config.compose import compose
    from qcls.heads import files
    from qcls.heads import weights_fingerprint as fp
    from qcls.heads.files import template_sha256
    from qcls.heads.head import Head, PromptHead, Read
    model = AutoModelForCausalLM.from_pretrained(tiny_dirs["qwen3"])
    spec = next(p for p in compose(tiny(tiny_dirs["qwen3"])).prompts if p.name == "category")
    rng, n = np.random.default_rng(0), len(spec.labels)
    ph = PromptHead(list(spec.labels), rng.normal(size=n), None, rng.normal(size=(n, model.config.hidden_size)),
                    Read(1, "position"), {"template_sha256": template_sha256(spec.template, spec.label_prefix)})
    meta = {"model": "tiny", "hidden_size": model.config.hidden_size, "num_layers": model.config.num_hidden_layers,
            "fingerprint": {"config": fp.config_fingerprint(model.config), "weights": fp.weights_fingerprint(model)}}
    path = tmp_path_factory.mktemp("label_next") / "head.yaml"
    files.save(Head({"category": ph}, "head", meta), path)
    return path


def test_label_next_on_a_tiny_model(tiny_dirs, category_head, tmp_path, monkeypatch, capsys):
    from qcls.config.compose import compose
    from qcls.cli.label_next import _read, classifier
    over = [*tiny(tiny_dirs["qwen3"]), f"calibration={category_head}"]
    clf = classifier(compose(over))
    got = _read(clf, ["red dress", "boys hoodie"])  # the head's probabilities; the LLM's where there is none
    res = clf.classify(["red dress", "boys hoodie"])
    raw = softmax(np.array([[s.score for s in r.prompts[1].labels] for r in res]))
    raw_category = softmax(np.array([[s.score for s in r.prompts[0].labels] for r in res]))
    assert not np.allclose(got["probs"]["category"], raw_category, atol=1e-3)
    np.testing.assert_allclose(got["probs"]["audience"], raw, atol=1e-6)
    np.testing.assert_allclose(got["probs"]["category"], [[s.prob for s in r.prompts[0].labels] for r in res],
                               atol=1e-6)
    assert got["served_by"] == {"category": "head (position @ layer 1)", "audience": "LLM label scores"}
    del clf

    monkeypatch.chdir(tmp_path)
    pool = ["red summer dress", "Red Summer Dress", "mens slim jeans", "boys hoodie", "girls pink skirt", "socks",
            "white cotton tee", "maternity dress", "wool knit top", "beige trench coat", "gift ideas"]
    (tmp_path / "pool.txt").write_text("\n".join(pool) + "\n", encoding="utf-8")
    write_set(tmp_path / "done.jsonl", [("socks", {"category": "other"}), ("gift ideas", {"audience": "none"})])
    assert main(["label-next", "pool.txt", *over, "--labelled", "done.jsonl", "-n", "4", "--hint", "--json",
                 "--out", "next/batch.csv"]) == 0
    out = capsys.readouterr()
    picks = [json.loads(line) for line in out.out.splitlines()]
    with open(tmp_path / "next" / "batch.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["query", "category", "audience", "count", "why", "hint:category", "hint:audience"]
    assert [r[0] for r in rows[1:]] == [p["query"] for p in picks] and len(picks) == 4
    assert not {"socks", "gift ideas", "Red Summer Dress"} & {p["query"] for p in picks}  # labelled, duplicate
    assert all(r[1] == r[2] == "" for r in rows[1:]) and {p["kind"] for p in picks} == {"uncertainty", "coverage"}
    assert [p["rank"] for p in picks] == [1, 2, 3, 4] and set(picks[0]["hint"]) == {"category", "audience"}
    assert "ranked by: category: head (position @ layer 1); audience: LLM label scores" in out.err
    assert "11 rows, 10 distinct queries; 2 already labelled; 8 candidates" in out.err
    # the file it wrote is a labelled set to fill in: `qcls calibrate --eval` reads it once labelled
    from qcls.eval.dataset import load_eval_set
    text = (tmp_path / "next" / "batch.csv").read_text(encoding="utf-8").replace(",,,", ",dress,woman,", 1)
    (tmp_path / "filled.csv").write_text(text, encoding="utf-8")
    assert len(load_eval_set(tmp_path / "filled.csv", compose(over).prompts).examples) == 1
