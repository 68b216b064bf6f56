"""Choosing the heads' depth for a prompt set (qcls/fitting/head_depth.py) on a hand-made table of per-fold
cross-validated log-losses whose means, standard errors and choices are worked out by hand below."""
from __future__ import annotations

import math

import pytest

from qcls.errors import ConfigError
from qcls.fitting import head_depth as D
from qcls.heads.head import Read

N = 12  # layers of the imaginary model


def cv(layer, folds, kind="position", acc=0.5):
    """A candidate whose three folds have equal size, so its log-loss is the mean of the fold means."""
    return D.ReadCV.from_folds(Read(layer, kind), 1.0, sum(folds) / len(folds), folds, acc)


# SE of three fold values a-d, a, a+d = std(ddof 1) / √3 = d / √3:
#   prompt a: best position@9 = 0.50 ± 0.1/√3 = 0.0577 → within one SE: log-loss ≤ 0.5577;
#             position@6 = 0.55 is within, position@3 = 1.0 and final = 0.8 are not.
#   prompt b: best final = 0.20 ± 0.0577 → within: ≤ 0.2577; position@9 = 0.25 is within, position@6 = 0.30 not.
# One-SE exit: the shallowest exit where both are within: 6 has b at 0.30 (no), 9 has a 0.50, b 0.25 (yes) → 9,
# cost 9 / 12 = 0.75. Rule best: a at 9, b at final → final, cost 1.0.
TRIED = {
    "a": [cv("final", [0.7, 0.8, 0.9]), cv(3, [0.9, 1.0, 1.1]), cv(6, [0.45, 0.55, 0.65]),
          cv(9, [0.4, 0.5, 0.6], acc=0.9), cv(9, [0.6, 0.6, 0.6], kind="query_mean")],
    "b": [cv("final", [0.1, 0.2, 0.3], acc=0.95), cv(3, [0.4, 0.4, 0.4]), cv(6, [0.26, 0.30, 0.34]),
          cv(9, [0.2, 0.25, 0.3], acc=0.93)],
}


def test_standard_error_by_hand():
    assert D.standard_error([0.4, 0.5, 0.6]) == pytest.approx(0.1 / math.sqrt(3))
    assert D.standard_error([0.26, 0.30, 0.34]) == pytest.approx(0.04 / math.sqrt(3))
    assert D.standard_error([0.3]) == 0.0


def test_one_se_rule_takes_the_shallowest_exit_where_every_prompt_is_within_one_se():
    c = D.choose(TRIED, N, "one-se")
    assert c.exit == 9 and c.cost == pytest.approx(0.75) and c.best_exit == "final"
    assert c.reads["a"].read == Read(9, "position") and c.reads["b"].read == Read(9, "position")
    rows = {r["exit_layer"]: r for r in c.table}
    assert list(rows) == [3, 6, 9, "final"]  # by depth, final last
    assert [rows[e]["all_within_one_se"] for e in rows] == [False, False, True, True]
    assert rows[6]["prompts"]["a"] == {"read": "position@6", "cv_accuracy": 0.5, "cv_log_loss": 0.55,
                                       "cv_log_loss_se": round(0.1 / math.sqrt(3), 4), "within_one_se": True}
    assert rows[6]["prompts"]["b"]["within_one_se"] is False and rows[6]["prompts"]["b"]["cv_log_loss"] == 0.3
    # at the final exit every read is there: each prompt's own best
    assert rows["final"]["prompts"]["a"]["read"] == "position@9" and rows["final"]["prompts"]["b"]["read"] == \
        "position@final"
    assert (rows[3]["forward_cost"], rows[9]["layers_run"], rows["final"]["forward_cost"]) == (0.25, 9, 1.0)


def test_best_rule_is_each_prompts_lowest_log_loss_whatever_it_costs():
    c = D.choose(TRIED, N, "best")
    assert c.exit == "final" and c.cost == 1.0
    assert c.reads["a"].read == Read(9) and c.reads["b"].read == Read("final")


def test_max_layer_drops_deeper_reads_and_final_before_the_rule():
    # ≤ 6: a's best is position@6 = 0.55 ± 0.0577 (3 = 1.0 not within); b's best is position@6 = 0.30 ± 0.0231
    # (3 = 0.40 not within) → exit 6, cost 0.5, under either rule
    for rule in D.RULES:
        c = D.choose(TRIED, N, rule, max_layer=6)
        assert c.exit == 6 and c.cost == 0.5 and c.best_exit == 6
        assert {p: r.read for p, r in c.reads.items()} == {"a": Read(6), "b": Read(6)}
        assert [r["exit_layer"] for r in c.table] == [3, 6]
    assert D.choose(TRIED, N, "one-se", max_layer=N).best_exit == "final"  # N layers include the final read


def test_max_layer_that_leaves_nothing_is_refused_naming_the_layers():
    with pytest.raises(ConfigError, match=r"max layer 6: the reads asked for \(layer 9\) all lie deeper"):
        D.within([Read(9)], N, 6)
    assert D.within([Read("final"), Read(3), Read(9)], N, 6) == [Read(3)]
    with pytest.raises(ConfigError, match="prompt 'a' has no candidate read at or below layer 2"):
        D.choose(TRIED, N, "one-se", max_layer=2)
    with pytest.raises(ConfigError, match="layer rule 'cheap'"):
        D.choose(TRIED, N, "cheap")


def test_heads_on_the_scores_run_every_layer_so_each_prompt_keeps_its_best():
    c = D.choose(TRIED, N, "one-se", full_depth="the heads read the raw label scores")
    assert c.exit == "final" and c.reads["b"].read == Read("final")
    assert "runs all 12 layers whatever the read" in c.notes[0]


def test_meta_and_printed_table():
    meta = D.choose(TRIED, N, "one-se").as_meta()
    assert (meta["exit_layer"], meta["layers_run"], meta["forward_cost"]) == (9, 9, 0.75)
    assert meta["most_accurate"] == {"exit_layer": "final", "forward_cost": 1.0}
    lines = D.table_lines(meta)
    assert "exit after 9 of 12 layers = 0.75 of the forward" in lines[0]
    chosen = [x for x in lines if x.lstrip().startswith("→")]
    assert len(chosen) == 1 and "9 (9/12)" in chosen[0] and "position@9 0.900 0.500±0.058*" in chosen[0]


def test_forward_costs_take_the_deepest_read_and_full_depth_without_a_state_head():
    got = D.forward_costs({"a": 6, "b": 9}, N)
    assert (got["layers_run"], got["forward_cost"]) == (9, 0.75) and got["per_prompt"]["a"]["forward_cost"] == 0.5
    got = D.forward_costs({"a": 6, "c": None}, N)  # c: raw scores (or a head on them): all N layers
    assert got["forward_cost"] == 1.0 and got["per_prompt"]["c"] == {"read_layer": None, "layers_run": 12,
                                                                      "forward_cost": 1.0}
    assert D.forward_costs({"a": "final"}, N)["per_prompt"]["a"]["layers_run"] == 12
