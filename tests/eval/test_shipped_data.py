"""The shipped e-commerce set (data/eval/) and the few-shot prompt files: format, coverage, no leaks.

The data files are read with plain `json` on purpose, so these checks do not depend on the loader they
feed; one test also runs them through the loader the sweep uses.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from qcls.config.compose import compose

ROOT = Path(__file__).resolve().parents[2]
SPLITS = {"dev": ROOT / "qcls/data/eval/ecommerce_dev.jsonl", "test": ROOT / "qcls/data/eval/ecommerce_test.jsonl"}
CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
SHOT = re.compile(r"<\|im_start\|>user\nquery: (.*?)<\|im_end\|>\n<\|im_start\|>assistant\nlabel: (.*?)<\|im_end\|>\n")
CATEGORY_ZH = {"dress": "连衣裙", "jeans": "牛仔裤", "shirt": "衬衫", "trench": "风衣", "skirt": "半身裙", "tee": "T恤",
               "hoodie": "卫衣", "knit": "针织衫", "other": "其他", "none": "无"}
AUDIENCE_ZH = {"boy": "男童", "girl": "女童", "man": "男士", "woman": "女士", "pregnant": "孕妇", "none": "无"}


def normalise(query: str) -> str:
    return " ".join(query.casefold().split())


@pytest.fixture(scope="module")
def label_sets() -> dict[str, list[str]]:
    return {p.name: p.labels for p in compose(["prompts=ecommerce8"]).prompts}


@pytest.fixture(scope="module")
def splits() -> dict[str, list[dict]]:
    out = {}
    for name, path in SPLITS.items():
        rows = []
        for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            assert line.strip(), f"{path}:{no}: blank line"
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                pytest.fail(f"{path}:{no}: not JSON ({e})")
        out[name] = rows
    return out


def test_every_query_has_a_valid_gold_label_for_every_prompt(splits, label_sets):
    assert len(label_sets) == 8
    for name, rows in splits.items():
        for i, r in enumerate(rows, start=1):
            where = f"{name}:{i} {r.get('query')!r}"
            assert set(r) == {"query", "labels"}, where
            assert isinstance(r["query"], str) and r["query"] == r["query"].strip() and r["query"], where
            assert set(r["labels"]) == set(label_sets), f"{where}: prompts {sorted(r['labels'])}"
            for prompt, gold in r["labels"].items():
                assert gold in label_sets[prompt], f"{where}: {prompt}={gold!r} not in {label_sets[prompt]}"


def test_chinese_prompts_mirror_the_english_decision(splits):
    for rows in splits.values():
        for r in rows:
            lab = r["labels"]
            assert lab["category_zh"] == CATEGORY_ZH[lab["category"]], r["query"]
            assert lab["audience_zh"] == AUDIENCE_ZH[lab["audience"]], r["query"]


def test_size_and_chinese_share(splits):
    rows = splits["dev"] + splits["test"]
    assert len(rows) >= 240
    assert min(len(r) for r in splits.values()) >= 0.4 * len(rows)  # roughly half and half
    share = sum(bool(CJK.search(r["query"])) for r in rows) / len(rows)
    assert 0.40 <= share <= 0.60, f"share of queries with CJK characters {share:.1%}"


def test_every_label_is_covered_in_the_set_and_in_each_split(splits, label_sets):
    counts = {name: Counter((p, r["labels"][p]) for r in rows for p in r["labels"]) for name, rows in splits.items()}
    total = counts["dev"] + counts["test"]
    short = [(p, lab, total[(p, lab)]) for p, labs in label_sets.items() for lab in labs if total[(p, lab)] < 3]
    assert not short, f"labels seen fewer than 3 times in the whole set: {short}"
    for name, c in counts.items():
        missing = [(p, lab) for p, labs in label_sets.items() for lab in labs if c[(p, lab)] < 1]
        assert not missing, f"labels absent from the {name} split: {missing}"


def test_no_duplicate_queries_within_or_across_splits(splits):
    seen: dict[str, str] = {}
    for name, rows in splits.items():
        for i, r in enumerate(rows, start=1):
            key = normalise(r["query"])
            assert key not in seen, f"{name}:{i} {r['query']!r} duplicates {seen[key]}"
            seen[key] = f"{name}:{i}"


@pytest.mark.parametrize("name", ["default", "ecommerce8"])
def test_fewshot_prompts_only_add_examples_to_the_prefix(name):
    zero = compose([f"prompts={name}"]).prompts
    few = compose([f"prompts={name}_fewshot"]).prompts
    assert [p.name for p in few] == [p.name for p in zero]
    for z, f in zip(zero, few):
        assert (f.labels, f.label_prefix, f.suffix) == (z.labels, z.label_prefix, z.suffix), f.name
        system = z.prefix.split("<|im_start|>user\n")[0]
        assert f.prefix.startswith(system), f"{f.name}: the system turn changed"
        shots = SHOT.findall(f.prefix[len(system):])
        assert f.prefix == system + "".join(
            f"<|im_start|>user\nquery: {q}<|im_end|>\n<|im_start|>assistant\nlabel: {a}<|im_end|>\n" for q, a in shots
        ) + "<|im_start|>user\nquery: ", f"{f.name}: prefix is not system turn + examples + the final user turn"
        assert 4 <= len(shots) <= 6, f"{f.name}: {len(shots)} examples"
        answers = [a for _, a in shots]
        assert all(a in f.labels for a in answers), f"{f.name}: {answers}"
        assert len(set(answers)) >= 3, f"{f.name}: the examples should show a mix of labels, got {answers}"
        assert {"none", "无"} & set(answers), f"{f.name}: no example shows the no-intent label"


BASE_SETS = {"gemma3_fewshot": "default", "gemma3_ecommerce8_fewshot": "ecommerce8"}


def base_shots(p) -> tuple[str, str, list[tuple[str, str]]]:
    """(task line, field name, examples) of a base-model prompt '<bos>TASK\n\nQuery: q\nField: a\n\n…Query: '
    ('查询' for the Chinese prompts); asserts the prefix is exactly that."""
    qk = "查询" if p.name.endswith("_zh") else "Query"
    field = p.suffix.removeprefix("\n").removesuffix(":")
    assert p.suffix == f"\n{field}:", f"{p.name}: suffix {p.suffix!r}"
    head, _, body = p.prefix.partition("\n\n")
    shots = re.findall(rf"{qk}: (.*?)\n{re.escape(field)}: (.*?)\n\n", body)
    assert head.startswith("<bos>") and "\n" not in head, f"{p.name}: the task line"
    assert body == "".join(f"{qk}: {q}\n{field}: {a}\n\n" for q, a in shots) + f"{qk}: ", \
        f"{p.name}: prefix is not task line + examples + the final query line"
    return head, field, shots


@pytest.mark.parametrize("name", sorted(BASE_SETS))
def test_base_model_prompts_are_plain_few_shot_over_the_same_labels(name):
    """The gemma3_demo sets: plain text (no chat markup), the prompt names, labels and label_prefix of their
    chat-markup counterpart, so data/eval/ serves them; examples of every kind, the no-intent label among them."""
    same = compose([f"prompts={BASE_SETS[name]}"]).prompts
    base = compose([f"prompts={name}"]).prompts
    assert [p.name for p in base] == [p.name for p in same]
    for b, z in zip(base, same):
        assert (b.labels, b.label_prefix) == (z.labels, z.label_prefix), b.name
        assert "<|im_start|>" not in b.template and "<start_of_turn>" not in b.template
        _, _, shots = base_shots(b)
        answers = [a for _, a in shots]
        assert 8 <= len(shots) <= 12 and all(a in b.labels for a in answers), (b.name, answers)
        assert len(set(answers)) >= min(len(b.labels), 4) and {"none", "无"} & set(answers), (b.name, answers)


def test_no_fewshot_example_is_an_eval_query(splits):
    eval_queries = {normalise(r["query"]) for rows in splits.values() for r in rows}
    shots = {q for name in ("default_fewshot", "ecommerce8_fewshot")
             for p in compose([f"prompts={name}"]).prompts for q, _ in SHOT.findall(p.prefix)}
    shots |= {q for name in BASE_SETS for p in compose([f"prompts={name}"]).prompts for q, _ in base_shots(p)[2]}
    assert len(shots) >= 40
    leaked = sorted(q for q in shots if normalise(q) in eval_queries)
    assert not leaked, f"few-shot examples found in the eval set: {leaked}"


@pytest.mark.parametrize("prompts", ["ecommerce8", "default", *BASE_SETS])
def test_the_sweep_loader_accepts_both_splits(prompts):
    from qcls.eval.dataset import load_eval_set
    specs = compose([f"prompts={prompts}"]).prompts
    for path in SPLITS.values():
        s = load_eval_set(path, specs)
        assert s.unlabelled_lines == [] and set(s.counts()) == {p.name for p in specs}


def test_the_shipped_split_is_the_deterministic_split_of_the_union(splits):
    import importlib.util
    spec = importlib.util.spec_from_file_location("make_splits", ROOT / "qcls/data/eval/make_splits.py")
    make_splits = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_splits)
    again = make_splits.split(list(reversed(splits["test"])) + splits["dev"])  # input order must not matter
    for name in SPLITS:
        assert [r["query"] for r in again[name]] == [r["query"] for r in splits[name]], name
