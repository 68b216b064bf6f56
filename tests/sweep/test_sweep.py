"""`qcls sweep` end to end on a tiny model, in this process: a 2×2 multirun, its results against metrics
worked out by hand from predictions.jsonl, model reuse, failed jobs, and the report rebuilt by --report."""
from __future__ import annotations

import csv
import json
import math
import shutil

import numpy as np
import pytest

from qcls.eval import metrics
from qcls.sweep import models
from qcls.heads.files import load as load_head
from qcls.sweep.sweep import main
from tests.eval.sweep_helpers import EVAL10, FIT10, read_jsonl, tiny, write_set

PNG = b"\x89PNG\r\n\x1a\n"
# one worker runs this module: its 2×2 sweep (the module fixture) is then run once, not once per worker
pytestmark = pytest.mark.xdist_group("sweep2x2")


@pytest.fixture(scope="module")
def sweep(tiny_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep2x2")
    ev, fit = write_set(root / "eval.jsonl", EVAL10), write_set(root / "fit.jsonl", FIT10)
    models.release()  # nothing held from another test: job 0 must load
    out = root / "sweep"
    rc = main(["-m", "scoring=trie,mean_logprob", "engine.max_batch_size=2,4", *tiny(tiny_dirs["qwen3"]),
               f"eval.path={ev}", f"eval.fit_on={fit}", "eval.batch1_queries=3", f"hydra.sweep.dir={out}"])
    models.release()
    jobs = {n: json.loads((out / str(n) / "result.json").read_text()) for n in range(4)}
    return rc, out, jobs


def csv_rows(path) -> dict[str, dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return {r["job"]: r for r in csv.DictReader(f)}


def by_hand(preds: list[dict], prompt: str, probs_key: str = "probs") -> dict[str, float]:
    """Accuracy, macro-F1 and 15-bin ECE of one prompt, straight from the definitions."""
    rows = [r["prompts"][prompt] for r in preds if r["prompts"][prompt]["gold"] is not None]
    winner = [max(r[probs_key], key=r[probs_key].get) for r in rows]
    right = [w == r["gold"] for w, r in zip(winner, rows)]
    f1 = []
    for lab in rows[0][probs_key]:
        tp = sum(w == lab and r["gold"] == lab for w, r in zip(winner, rows))
        fp = sum(w == lab and r["gold"] != lab for w, r in zip(winner, rows))
        fn = sum(w != lab and r["gold"] == lab for w, r in zip(winner, rows))
        if tp + fp + fn:
            f1.append(2 * tp / (2 * tp + fp + fn))
    bins: dict[int, list[tuple[float, bool]]] = {}
    for r, ok in zip(rows, right):
        conf = max(r[probs_key].values())
        bins.setdefault(min(14, max(0, math.ceil(conf * 15) - 1)), []).append((conf, ok))
    ece = sum(len(b) / len(rows) * abs(sum(ok for _, ok in b) / len(b) - sum(c for c, _ in b) / len(b))
              for b in bins.values())
    return {"accuracy": sum(right) / len(rows), "macro_f1": sum(f1) / len(f1), "ece": ece}


def test_2x2_sweep_runs_every_job_and_loads_the_model_once(sweep):
    rc, out, jobs = sweep
    assert rc == 0
    assert [j["status"] for j in jobs.values()] == ["ok"] * 4, [j["reason"] for j in jobs.values()]
    assert [j["model_reused"] for j in jobs.values()] == [False, True, True, True]
    assert jobs[0]["load_s"] is not None and all(jobs[n]["load_s"] is None for n in (1, 2, 3))
    assert len({j["job"]["pid"] for j in jobs.values()}) == 1  # the basic launcher: one process
    for j in jobs.values():
        assert j["eval"]["n_queries"] == 10 and j["eval"]["ignored_prompts"] == ["color"]
        assert j["per_prompt"]["category"]["n"] == 10 and j["per_prompt"]["audience"]["n"] == 8
        assert any(o.startswith("scoring=") for o in j["overrides"])
        lat, b = j["latency_ms"], j["config"]["max_batch_size"]
        assert lat["batch1"]["n"] == 3 and lat["batch1"]["p50"] > 0 and lat["batch1"]["tokens_per_forward"] > 0
        assert lat["full_batch"]["batch_size"] == b and lat["full_batch"]["n"] == 10 // b
        assert lat["full_batch"]["tokens_per_forward"] > lat["batch1"]["tokens_per_forward"]
        assert j["gpu_memory"] is None and j["device"].startswith("cpu") and j["commit"] and j["date"]
        m = j["per_prompt"]["category"]["confusion"]
        assert m["labels"][0] == "dress" and np.array(m["matrix"]).sum() == 10
    for name in ("summary.md", "summary.csv", "accuracy_latency.png", "reliability.png"):
        assert (out / name).is_file(), name


def test_summary_rows_equal_metrics_computed_by_hand(sweep):
    _, out, jobs = sweep
    rows = csv_rows(out / "summary.csv")
    assert set(rows) == {"0", "1", "2", "3"}
    accs = [float(r["mean_accuracy"]) for r in rows.values()]
    assert accs == sorted(accs, reverse=True)  # sorted by mean accuracy
    for n in range(4):
        preds = read_jsonl(out / str(n) / "predictions.jsonl")
        hand = {p: by_hand(preds, p) for p in ("category", "audience")}
        row = rows[str(n)]
        for k in ("accuracy", "macro_f1", "ece"):
            want = (hand["category"][k] + hand["audience"][k]) / 2
            assert float(row[f"mean_{k}"]) == pytest.approx(want, abs=2e-6), (n, k)
        assert float(row["accuracy[category]"]) == pytest.approx(hand["category"]["accuracy"], abs=1e-6)
        # NLL from the stored scores
        nll = np.mean([-math.log(r["prompts"]["category"]["probs"][r["prompts"]["category"]["gold"]])
                       for r in preds])
        assert jobs[n]["per_prompt"]["category"]["nll"] == pytest.approx(nll, rel=1e-6)
        assert row["model_reused"] == ("no" if n == 0 else "yes")


def test_agreement_with_exact_same_forward_and_separate_pass_agree(sweep):
    _, out, jobs = sweep
    by_cfg = {(j["strategy"], j["config"]["max_batch_size"]): n for n, j in jobs.items()}
    for b in (2, 4):
        trie, mlp = by_cfg[("trie", b)], by_cfg[("mean_logprob", b)]
        assert jobs[trie]["agreement_with_exact"]["method"].startswith("separate scoring=exact pass")
        assert jobs[mlp]["agreement_with_exact"]["method"].startswith("same forward")
        pt, pm = read_jsonl(out / f"{trie}/predictions.jsonl"), read_jsonl(out / f"{mlp}/predictions.jsonl")
        for p in ("category", "audience"):
            # exact winners from mean_logprob × tokens (same forward) equal those of the separate exact pass
            assert [r["prompts"][p]["exact_winner"] for r in pt] == [r["prompts"][p]["exact_winner"] for r in pm]
            share = np.mean([r["prompts"][p]["winner"] == r["prompts"][p]["exact_winner"] for r in pt])
            assert jobs[trie]["agreement_with_exact"]["per_prompt"][p] == pytest.approx(share)


def test_calibration_columns_are_fitted_on_fit_on_and_applied_in_python(sweep):
    _, out, jobs = sweep
    rows = csv_rows(out / "summary.csv")
    for n, j in jobs.items():
        block = j["calibration"]
        assert block["source"].startswith("fitted on") and block["method"] == "temperature_bias"
        assert block["n_fit"] == {"category": 10, "audience": 10}
        cal = load_head(out / str(n) / "calibration.yaml")
        assert cal.meta["strategy"] == j["strategy"]
        preds = read_jsonl(out / str(n) / "predictions.jsonl")
        for r in preds:
            p = r["prompts"]["category"]
            want = metrics.softmax(np.array([cal.apply("category", list(p["scores"].values()))]))[0]
            assert list(p["calibrated_probs"].values()) == pytest.approx(list(want), abs=1e-9)
        hand = {p: by_hand(preds, p, "calibrated_probs") for p in ("category", "audience")}
        for k in ("accuracy", "ece"):
            want = (hand["category"][k] + hand["audience"][k]) / 2
            assert float(rows[str(n)][f"cal_{k}"]) == pytest.approx(want, abs=2e-6)
        assert block["per_prompt"]["category"]["raw"]["accuracy"] == j["per_prompt"]["category"]["accuracy"]


def test_report_rebuilds_the_same_summary(sweep, tmp_path):
    _, out, _ = sweep
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    before = {n: (copy / n).read_text() for n in ("summary.md", "summary.csv")}
    for n in ("summary.md", "summary.csv", "accuracy_latency.png", "reliability.png"):
        (copy / n).unlink()
    assert main(["--report", str(copy)]) == 0
    assert {n: (copy / n).read_text() for n in before} == before
    for n in ("accuracy_latency.png", "reliability.png"):
        assert (copy / n).read_bytes()[:8] == PNG
    md = before["summary.md"]
    assert "4 jobs: 4 ok, 0 failed" in md and "![accuracy_latency](accuracy_latency.png)" in md
    # several sweep folders merge into one report
    merged = tmp_path / "merged"
    assert main(["--report", str(out), str(copy), "--out", str(merged)]) == 0
    assert len(csv_rows(merged / "summary.csv")) == 8


def test_failing_jobs_are_reported_and_the_sweep_goes_on(tiny_dirs, tmp_path):
    good = write_set(tmp_path / "good.jsonl", EVAL10[:4])
    bad = tmp_path / "bad.jsonl"
    lines = good.read_text().splitlines()
    lines[2] = json.dumps({"query": "boys hoodie", "labels": {"category": "sweatshirt"}})
    bad.write_text("\n".join(lines) + "\n")
    out = tmp_path / "sweep"
    rc = main(["-m", f"eval.path={bad},{good}", *tiny(tiny_dirs["qwen3"]), "eval.batch1_queries=1",
               "eval.agreement_with_exact=false", f"hydra.sweep.dir={out}"])
    assert rc == 0
    r0, r1 = (json.loads((out / f"{n}/result.json").read_text()) for n in (0, 1))
    assert r0["status"] == "failed" and f"{bad}:3:" in r0["reason"] and "'sweatshirt'" in r0["reason"]
    assert r1["status"] == "ok" and r1["agreement_with_exact"]["mean"] is None
    assert "agreement_with_exact=false" in r1["agreement_with_exact"]["reason"]
    md = (out / "summary.md").read_text()
    assert "2 jobs: 1 ok, 1 failed" in md and "## Failed jobs" in md and f"{bad}:3:" in md
    assert csv_rows(out / "summary.csv")["0"]["status"] == "failed"
    models.release()


def test_colliding_first_tokens_fail_the_job_before_any_weight_loads(tiny_dirs, tmp_path):
    ev = write_set(tmp_path / "eval.jsonl", EVAL10[:2])
    out = tmp_path / "run"  # a single run (no -m): one job, reported by the callback's on_run_end
    rc = main(["scoring=first_token", *tiny(tiny_dirs["qwen3_qwentok"]), "prompts=ecommerce8",
               f"eval.path={ev}", f"hydra.run.dir={out}"])
    assert rc == 0
    r = json.loads((out / "result.json").read_text())
    assert r["status"] == "failed" and "first-token scoring" in r["reason"], r["reason"]
    assert r["config"]["backend"] == "int8"  # the default, auto, is recorded as what it runs on this CPU
    assert "1 jobs: 0 ok, 1 failed" in (out / "summary.md").read_text()


def test_help_explains_format_sweep_report_and_calibration(capsys):
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    for word in ('{"query"', "eval.path=", "-m scoring=", "summary.md", "--report", "qcls calibrate",
                 "calibration=FILE", "hydra/launcher=joblib", "CUDA_VISIBLE_DEVICES"):
        assert word in text, word


@pytest.mark.parametrize("bad, words", [
    (["-m", "scoring=trie,bogus"], ["Could not find 'scoring/bogus'", "mean_logprob"]),
    (["-m", "scoring=trie,exact", "engine.max_batch_size=2,0"], ["engine.max_batch_size", "greater than or equal to 1"]),
    (["-m", "scoring=trie", "nokey=1"], ["Could not override 'nokey'", "check its spelling"]),
    (["-m", "scoring=trie,exact", "eval.path=nothere.csv"], ["eval.path='nothere.csv': no such file", "looked at"]),
    (["-m", "scoring=trie", "eval.fit_on=nothere.jsonl"], ["eval.fit_on='nothere.jsonl': no such file"]),
])
def test_bad_override_anywhere_in_a_sweep_is_one_error_before_any_job(tmp_path, capsys, bad, words):
    """Every swept value is composed and validated first: exit 2, one `qcls sweep: error:` message and no job
    directory, not Hydra's own exit 1 nor a sweep of jobs that fail one by one."""
    from qcls.cli import main as cli_main
    out = tmp_path / "sweep"
    assert cli_main(["sweep", *bad, "eval=dev", f"hydra.sweep.dir={out}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qcls sweep: error:") and "Traceback" not in err and "Config search path" not in err
    for w in words:
        assert w in err, (w, err)
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.fresh_load  # each job's own load is the subject (load_s)
def test_one_multirun_compares_the_two_demo_models(demo_cfg_overrides, tmp_path):
    """`-m model=smollm2_demo,gemma3_demo`: each job loads its own model with its own default prompts (chat
    few-shot for the instruct SmolLM2, plain few-shot for the base Gemma3), scored on the same dev queries."""
    from tests.conftest import skip_without_gemma3_demo
    skip_without_gemma3_demo()
    models.release()
    out = tmp_path / "sweep"
    rc = main(["-m", "model=smollm2_demo,gemma3_demo", *[o for o in demo_cfg_overrides if not o.startswith("model=")], "eval.limit=4", "eval.batch1_queries=1",
               "eval.agreement_with_exact=false", "engine.max_batch_size=2", f"hydra.sweep.dir={out}"])
    models.release()
    assert rc == 0
    jobs = [json.loads((out / str(n) / "result.json").read_text()) for n in range(2)]
    assert [j["status"] for j in jobs] == ["ok", "ok"], [j["reason"] for j in jobs]
    assert [j["config"]["model"] for j in jobs] == ["smollm2_demo", "gemma3_demo"]
    assert not jobs[1]["model_reused"] and jobs[1]["load_s"] is not None  # the second model was loaded
    for j in jobs:
        assert set(j["per_prompt"]) == {"category", "audience"} and j["eval"]["n_queries"] == 4
    summary = (out / "summary.md").read_text()
    assert "smollm2_demo" in summary and "gemma3_demo" in summary
