"""The "own prompts and labelled queries" walkthrough, end to end on a tiny model: write a prompt set → label
60 queries in a CSV → `qcls calibrate --method head` → classify with the head → the learning curve and the
baselines of a sweep scored on a held-out CSV. The prompt set lives in a config folder of the user's own
(`qcls --config-dir myconf`), outside the package."""
from __future__ import annotations

import csv
import itertools
import json

import yaml

from qcls.classifier import Classifier
from qcls.cli import main
from qcls.config.compose import compose
from qcls.sweep import models
from tests.conftest import prompt

KINDS = {"dress": ["dress", "sundress", "gown"], "jeans": ["jeans", "denim pants", "slim jeans"],
         "hoodie": ["hoodie", "zip hoodie", "sweatshirt"]}
WHO = {"man": ["men", "mens", "for him"], "woman": ["women", "womens", "for her"], "kid": ["kids", "boys", "girls"]}
COLORS = ["red", "blue", "black", "white", "green", "grey", "navy"]


def labelled_rows() -> list[dict[str, str]]:
    """90 distinct queries, every (kind, who) pair 10 times; rows 9, 39 and 69 leave `who` empty (no gold)."""
    rows = []
    for i, ((kind, kw), (who, ww)) in enumerate(itertools.product(KINDS.items(), WHO.items())):
        for j in range(10):
            q = f"{COLORS[(i + j) % len(COLORS)]} {kw[j % 3]} {ww[(j // 3) % 3]} {j}"
            rows.append({"query": q, "kind": kind, "who": "" if j == 9 and i % 3 == 0 else who})
    return rows


def write_csv(path, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["query", "kind", "who"])
        w.writeheader()
        w.writerows(rows)
    return path


def test_own_prompts_labelled_csv_head_and_learning_curve(tiny_dirs, tmp_path, monkeypatch):
    conf = tmp_path / "myconf"  # 1. a prompt set of one's own, in a folder of one's own
    (conf / "prompts").mkdir(parents=True)
    shop = {"prompts": [prompt("kind", list(KINDS), system="What kind of garment?"),
                        prompt("who", list(WHO), system="Who is it for?")]}
    (conf / "prompts" / "shop.yaml").write_text("# @package _global_\n" + yaml.safe_dump(shop), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    rows = labelled_rows()  # 2. labelled queries in a CSV: 60 to fit on, 30 held out
    train, test = write_csv(tmp_path / "train.csv", rows[::3] + rows[1::3]), write_csv(tmp_path / "test.csv", rows[2::3])
    base = ["prompts=shop", "model.source=local", f"model.path={tiny_dirs['qwen3']}", "model.name=tiny",
            "engine.query_buckets=[8,16]", "max_query_tokens=16", "engine.warmup_requests=1"]
    # the model config's default head (the demo's) was fitted for other prompts: it is not forced on these
    heads = Classifier(compose(base, config_dir=conf)).heads
    assert heads.default and heads.with_head() == [] and set(heads.own) == {"kind", "who"}
    cd = ["--config-dir", str(conf)]
    assert main([*cd, "calibrate", "--method", "head", "--eval", str(train), "--out", "head.yaml", *base]) == 0  # 3.
    assert (tmp_path / "head.yaml").is_file() and (tmp_path / "head.safetensors").is_file()
    clf = Classifier(compose([*base, "calibration=head.yaml"], config_dir=conf))  # 4. classify with the head
    r = clf.classify(["red sundress for her 1"])[0]
    assert r.meta["heads"]["with_head"] == ["kind", "who"]
    # both heads read layer 1 of 2: the forward stops there, so no label scores and no raw winner
    assert r.meta["layers"]["layers"] == 1 and all(p.raw_label is None for p in r.prompts)
    assert main([*cd, "classify", *base, "calibration=head.yaml", "blue zip hoodie mens"]) == 0
    del clf
    out = tmp_path / "curve"  # 5. the learning curve on the held-out CSV, beside the baselines
    assert main([*cd, "sweep", *base, f"eval.path={test}", f"eval.fit_on={train}", "eval.fit_method=head",
                 "eval.head.curve_sizes=[15,30,45]", "eval.head.curve_draws=2", "eval.batch1_queries=0",
                 "eval.agreement_with_exact=false", f"hydra.run.dir={out}"]) == 0
    models.release()
    res = json.loads((out / "result.json").read_text())
    assert res["status"] == "ok", res.get("reason")
    assert res["eval"]["n_queries"] == 30 and res["per_prompt"]["who"]["n"] == 30
    curve = res["calibration"]["learning_curve"]
    assert curve["sizes"] == ["15", "30", "45", "all"] and len(curve["per_prompt"]["kind"]["15"]) == 2
    b = res["baseline"]
    assert b["source"] == f"fitted on {train}, scored on {test}" and b["per_prompt"]["kind"]["n_fit"] == 60
    assert b["per_prompt"]["who"]["n_fit"] == 57  # 3 fitting rows leave `who` empty: no gold for it there
    assert 0 <= b["per_prompt"]["kind"]["accuracy"] <= 1
    md = (out / "summary.md").read_text(encoding="utf-8")
    assert "## Learning curve" in md and "## Baselines per prompt" in md
