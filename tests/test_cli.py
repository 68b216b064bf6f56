"""The CLI end to end with the demo model: classify (table and --json), repl fed by a pipe, errors, bulk. One test
runs `qcls` as a process (stdout and stderr kept apart, the exit status); the others call its `main` in this
process, on the session's copy of the demo weights."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from qcls.cli import main
from qcls.config.overrides import split_args
from qcls.results import STAGES


def run(args: list[str], overrides: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qcls.cli", args[0], *overrides, *args[1:]], input=stdin, text=True,
                          capture_output=True, timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def cli(args: list[str], overrides: list[str], capsys, monkeypatch, stdin: str | None = None
        ) -> subprocess.CompletedProcess:
    """`qcls ARGS` in this process: its exit status, stdout and stderr."""
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    capsys.readouterr()
    try:
        rc = main([args[0], *overrides, *args[1:]])
    except SystemExit as e:  # argparse's --help and usage errors
        rc = e.code
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, rc, out.out, out.err)


def test_split_args():
    assert split_args(["red dress", "scoring=exact", "+x=1"], ["size=M"]) == (["red dress", "size=M"],
                                                                             ["scoring=exact", "+x=1"])


@pytest.mark.slow
def test_classify_table_and_progress(demo_cfg_overrides):
    p = run(["classify", "mens slim fit jeans", "boys hoodie"], demo_cfg_overrides)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert out.count("query: ") == 2 and "category" in out and "audience" in out and "forward" in out
    assert "[qcls] loading" in p.stderr and "warm-up" in p.stderr  # progress on stderr only
    assert "[qcls]" not in out


@pytest.mark.slow
def test_classify_json_and_bad_query(demo_cfg_overrides, capsys, monkeypatch):
    p = cli(["classify", "--json", "hoodie", "   ", "--", "size=M"], demo_cfg_overrides, capsys, monkeypatch)
    assert p.returncode == 1  # one query was refused
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    assert [r["query"] for r in rows] == ["hoodie", "   ", "size=M"]
    good, bad, literal = rows
    assert good["ok"] and len(good["prompts"]) == 2 and bad["error"].startswith("empty query")
    cat = good["prompts"][0]
    assert cat["prompt"] == "category" and abs(sum(lab["prob"] for lab in cat["labels"]) - 1) < 1e-6
    assert cat["label"] == max(cat["labels"], key=lambda lab: lab["prob"])["label"]
    # the demo's heads read middle layers: the forward stops there and no label scores are computed
    layers = good["meta"]["layers"]
    assert layers["layers"] < layers["of"] and not layers["label_scores"] and "prompt '" in layers["why"]
    assert layers["loaded"] == layers["of"]  # the model's default head: every layer loaded, the forward stops early
    assert all(lab["score"] is None and lab["head_score"] is not None for lab in cat["labels"])
    assert set(good["timings_ms"]) == {"tokenize", "prepare", "forward", "score", "postprocess", "total"}
    assert literal["ok"]  # after `--`, key=value is a query


@pytest.mark.slow
def test_repl_reads_a_pipe(demo_cfg_overrides, capsys, monkeypatch):
    p = cli(["repl", "--json"], demo_cfg_overrides, capsys, monkeypatch, stdin="summer dress\n\nboys tee\n")
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    assert [r["query"] for r in rows] == ["summer dress", "boys tee"] and all(r["ok"] for r in rows)


def test_config_error_is_one_line_not_a_traceback(demo_cfg_overrides, capsys, monkeypatch):
    p = cli(["classify", "x"], demo_cfg_overrides + ["scoring=greedy"], capsys, monkeypatch)
    assert p.returncode == 2 and "qcls: error:" in p.stderr and "Traceback" not in p.stderr


def test_help_lists_commands(capsys, monkeypatch):
    p = cli(["--help"], [], capsys, monkeypatch)
    assert p.returncode == 0 and all(c in p.stdout for c in ("classify", "repl", "serve", "check", "bulk", "sweep",
                                                              "calibrate", "audit", "--debug", "qcls check model="))


@pytest.mark.parametrize("cmd", ["sweep", "calibrate", "audit"])
def test_hydra_apps_get_their_own_command_line(cmd, monkeypatch, capsys):
    import importlib

    from qcls.cli import main
    from qcls.cli.commands import ROUTED
    from qcls.errors import ConfigError
    mod = importlib.import_module(ROUTED[cmd])
    seen = []
    monkeypatch.setattr(mod, "main", lambda argv: seen.append(argv) or 0)
    assert main([cmd, "-m", "scoring=trie,exact", "--help", "--", "x=1"]) == 0
    assert seen == [["-m", "scoring=trie,exact", "--help", "--", "x=1"]]  # argparse never saw them

    def fails(argv):
        raise ConfigError("the sweep config has no `eval` group", "add eval=dev")
    monkeypatch.setattr(mod, "main", fails)
    assert main(["--debug", cmd]) == 2
    err = capsys.readouterr().err
    assert f"qcls {cmd}: error: the sweep config has no `eval` group\n  add eval=dev" in err and "Traceback" in err


def test_the_table_shows_what_answers_each_prompt_and_a_heads_probabilities():
    from qcls.cli.commands import format_result
    from qcls.results import LabelScore, PromptResult, QueryResult
    labels = [LabelScore("dress", 2.0, 0.40, 1, 0.70, 0.5), LabelScore("jeans", 1.0, 0.55, 1, 0.20, 1.2),
              LabelScore("tee", 0.0, 0.05, 1, 0.10, -1.0)]
    r = QueryResult("q", [PromptResult("category", "jeans", 0.55, labels, raw_label="dress", raw_prob=0.70)],
                    query_tokens=1, batch_size=1, timings_ms={k: 0.1 for k in STAGES} | {"total": 0.5},
                    meta={"heads": {"with_head": ["category"], "lost": {}}})
    line = format_result(r).splitlines()[1]
    assert "[head] jeans      0.550" in line and "dress 0.400" in line and "tee 0.050" in line
    assert "(raw scores: dress 0.700)" in line
    r.prompts[0].label, r.prompts[0].abstained = None, True  # below its threshold: marked, every label listed
    line = format_result(r).splitlines()[1]
    assert "ABSTAINED" in line and "jeans 0.550" in line and "dress 0.400" in line and "→" not in line
    r.prompts[0].label = "none"
    assert "ABSTAINED → none" in format_result(r).splitlines()[1]
    # a label renamed: the default head file still has a head of the prompt's name, which no longer fits it
    from qcls.heads.startup import OTHER_LABELS, lost_head
    labels = [LabelScore("dress", 2.0, 0.7, 1), LabelScore("frock", 1.0, 0.3, 1)]
    r = QueryResult("q", [PromptResult("category", "dress", 0.7, labels), PromptResult("audience", "dress", 0.7, labels)],
                    query_tokens=1, batch_size=1, timings_ms={k: 0.1 for k in STAGES} | {"total": 0.5},
                    meta={"heads": {"with_head": ["audience"], "lost": {"category": lost_head(OTHER_LABELS)}}})
    lines = format_result(r).splitlines()
    assert "category  [LLM]  dress" in lines[1] and "audience  [head] dress" in lines[3]
    assert lines[2].split() == ["note:", *lost_head(OTHER_LABELS).split()]
    assert "LLM scores; refit with qcls calibrate --method head, or restore the labels" in lines[2]


@pytest.mark.slow
def test_bulk_file_in_file_out_with_the_demo_model(demo_cfg_overrides, tmp_path, capsys, monkeypatch):
    """`qcls bulk` end to end: CSV in, JSONL out, pass-through columns, an error row, the log-line progress
    and the summary on stderr (not a terminal here)."""
    inp = tmp_path / "log.csv"
    inp.write_text("id,query\n1,mens slim fit jeans\n2,\n3,mens slim fit jeans\n4,hoodie for boys\n", encoding="utf-8")
    p = cli(["bulk", str(inp), str(tmp_path / "out.jsonl")], demo_cfg_overrides, capsys, monkeypatch)
    assert p.returncode == 0, p.stderr
    rows = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in rows] == ["1", "2", "3", "4"] and rows[1]["error"].startswith("empty query")
    assert rows[0]["pred:category"] == rows[2]["pred:category"]
    assert rows[0]["pred:category:prob"] == rows[2]["pred:category:prob"]
    assert "[qcls bulk]" in p.stderr and "2 distinct queries classified" in p.stderr and '"empty": 1' in p.stderr


def test_bulk_refuses_a_file_that_is_not_what_its_name_says(demo_cfg_overrides, tmp_path, capsys, monkeypatch):
    inp = tmp_path / "log.csv"
    inp.write_text("id,text\n1,jeans\n", encoding="utf-8")
    from qcls.classifier import Classifier

    def load(self, backend):
        raise AssertionError("the model was loaded: the file should have been refused before")
    monkeypatch.setattr(Classifier, "_load", load)
    p = cli(["bulk", str(inp), str(tmp_path / "out.jsonl")], demo_cfg_overrides, capsys, monkeypatch)
    assert p.returncode == 2 and f"{inp} line 1: no column 'query'" in p.stderr and "--column" in p.stderr


def test_classify_says_each_threshold_and_its_promise():
    from qcls.heads.head import Head, PromptHead
    from qcls.heads.thresholds import Threshold, startup_line
    ph = PromptHead.temperature_bias(["a", "b"], 1.0, [0.0, 0.0])
    ph.threshold = Threshold(0.6, fitted={"target_precision": 0.95, "confidence": 0.9, "lower_bound": 0.951,
                                          "answered": 80, "n": 151})
    line = startup_line(Head({"p": ph}, "temperature_bias", {}), ["p", "q"])
    assert "p: ≥ 0.6000 (precision ≥ 0.95 certified at 90% confidence: lower bound 0.951 on 80 answered" in line
    assert "q: none (answers every query)" in line
    assert startup_line(None, ["p"]) is None
