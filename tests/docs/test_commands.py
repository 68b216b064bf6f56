"""Checking documented qcls command lines without running them (tests/docs/commands.py)."""
from __future__ import annotations

import pytest

from tests.docs.commands import check_qcls


@pytest.mark.parametrize("argv", [
    ["classify", "model=qwen3_4b", "model.source=local", "model.path=/models/no-such-dir", "gpu=t4", "slim jeans"],
    ["classify", "--json", "summer dress", "scoring=exact"],
    ["repl", "prompts=ecommerce8"],
    ["check", "--query-tokens", "12", "model=qwen3_8b", "backend=bnb-nf4"],
    ["serve", "serve.num_gpus=1", "model=qwen3_4b"],
    ["sweep", "-m", "scoring=trie,first_token", "eval=dev"],
    ["sweep", "--report", "multirun/x"],
    ["calibrate", "--method", "head", "--eval", "dev", "--out", "mine.yaml", "prompts=ecommerce8"],
    ["audit", "my_labels.csv", "--out", "doubts.csv", "--layer", "13", "prompts=ecommerce8"],
    ["--help"],
])
def test_valid_commands_pass(argv: list[str]) -> None:
    check_qcls(argv)


@pytest.mark.parametrize("argv, says", [
    (["classify", "scoring=nope", "x"], "scoring"),
    (["classify", "model.pathh=/m", "x"], "pathh"),
    (["classify", "--jsn", "x"], "--jsn"),
    (["classify", "scoring=exact"], "at least one query"),
    (["check", "stray query"], "overrides only"),
    (["sweep", "-m", "scoring=trie,nope", "eval=dev"], "nope"),
    (["calibrate", "--method", "magic"], "magic"),
    (["audit", "prompts=default"], "one labelled file"),
    (["audit", "a.csv", "--layers", "3"], "--layers"),
    (["serve", "serve.autoscaling={min_replicas:1,max_replica:4}"], "max_replica"),
])
def test_invalid_commands_are_refused(argv: list[str], says: str) -> None:
    with pytest.raises(Exception) as e:
        check_qcls(argv)
    assert says in str(e.value)
