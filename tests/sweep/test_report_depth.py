"""The report's accuracy-against-forward-cost section (qcls/sweep/report_depth.py) from hand-made job results."""
from __future__ import annotations

from pathlib import Path

from qcls.sweep import report_depth as R
from qcls.sweep.report import Job


def job(name: str, layer, acc: float, n: int = 12) -> tuple[dict, Job]:
    layers = n if layer in (None, "final") else layer
    fw = {"num_layers": n, "layers_run": layers, "forward_cost": layers / n,
          "per_prompt": {"p": {"read_layer": layer, "layers_run": layers, "forward_cost": layers / n}}}
    heads = {"p": {"read": {"layer": layer, "kind": "position"}}} if layer is not None else {}
    result = {"forward": fw, "calibration": {"heads": heads},
              "baseline": {"per_prompt": {"p": {"accuracy": 0.7}}}}
    row = {"job": name, "label": f"eval.head.layer={layer}", "accuracy[p]": 0.4,
           "cal_accuracy[p]": acc if layer is not None else None}
    return row, Job(Path(name), result)


def test_cost_table_marks_the_pareto_front_beside_tf_idf(tmp_path):
    # cost 0.25 → 0.80, 0.5 → 0.78 (dominated by the cheaper, more accurate 0.25), 0.75 → 0.90, final → 0.90
    # (dominated: as accurate, dearer); raw scores (no head) → 0.40 at 1.0 (dominated)
    made = [job("0", 3, 0.80), job("1", 6, 0.78), job("2", 9, 0.90), job("3", "final", 0.90), job("4", None, 0.0)]
    ok, by_job = [r for r, _ in made], {r["job"]: j for r, j in made}
    pts = R.points(ok, by_job)
    assert R.wanted(pts) and [q["cost"] for q in pts["p"]] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert pts["p"][4]["accuracy"] == 0.4 and pts["p"][4]["read"] == "raw scores"  # no head: raw accuracy
    lines = R.section(pts, R.tfidf(ok, by_job))
    body = [x for x in lines if x.startswith("| ")][1:]  # rows after the header, by cost
    assert body[0] == "| 0 | eval.head.layer=3 | position@3 | 3/12 | 0.250 | 0.250 | 0.800 | yes |"
    assert [x.split(" | ")[-1] for x in body[:5]] == ["yes |", " |", "yes |", " |", " |"]
    assert body[5] == "| | TF-IDF + LR (no LLM) | | 0 | 0 | | 0.700 | |"
    assert R.plot(pts, R.tfidf(ok, by_job), tmp_path / "c.png").stat().st_size > 1000


def test_no_section_when_every_answer_needs_the_whole_forward():
    made = [job("0", None, 0.0), job("1", "final", 0.9)]
    assert not R.wanted(R.points([r for r, _ in made], {r["job"]: j for r, j in made}))
