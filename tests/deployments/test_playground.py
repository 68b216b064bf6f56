"""The playground page in a real browser (Debian's Chromium, driven by Playwright) against a tiny Qwen3 on real
Ray Serve (an app of its own on the shared Ray): two queries' bars against the API's own answer, two identical labels refused
beside their field while the old prompts keep serving, an applied edit answering with the new prompt, the YAML it
downloads composing as a `--config-dir` prompt set, the key sent as a bearer token, keyboard use and a narrow
window. QCLS_WRITE_SCREENSHOT=1 writes docs/playground.png (the README's screenshot). Without a browser or Ray: the
routes' validation, reload and refusals over a tiny model, and the page's files open under an API key."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import pytest

from tests.deployments.helpers import HANG_GUARD_S

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
QUERIES = ["red hoodie for boys", "maxi dress for pregnant women"]
APP = "playground"
GUARD_MS = HANG_GUARD_S * 1e3  # a hang guard on the page's answers, not a bound


def chromium() -> str:
    for path in (os.environ.get("QCLS_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                 shutil.which("chromium-browser")):
        if path and os.access(path, os.X_OK):
            return path
    pytest.skip("no Chromium installed (apt-get install -y chromium, or QCLS_CHROMIUM=PATH): the playground's "
                "browser test needs one")


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright; its browser download is not needed)")
    exe = chromium()
    with sync_playwright() as pw:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start
        b = pw.chromium.launch(executable_path=exe, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def app(serve_port, serve_overrides, request):
    """An app of its own on the shared Ray (its prompts change here): the LLM's own label scores (calibration=null),
    so every answer has raw scores to show.
    Yields (the replica's own URL, the URL through Serve's proxy)."""
    from ray import serve

    from qcls.cli.serve import direct_urls
    from qcls.config.compose import compose
    from qcls.deployments.app import app_for

    # the README's screenshot shows the demo model's answers, the tests a tiny model's
    model = request.getfixturevalue("demo_cfg_overrides") if os.environ.get("QCLS_WRITE_SCREENSHOT") == "1" \
        else serve_overrides
    overrides = [*model, "calibration=null", "engine.max_batch_size=4", "serve.num_cpus=0.25",
                 f"serve.app_name={APP}", f"serve.route_prefix=/{APP}"]
    serve.run(app_for(compose(overrides), overrides), name=APP, route_prefix=f"/{APP}")
    [url] = direct_urls(APP, "127.0.0.1", wait_s=30)
    yield url, f"http://127.0.0.1:{serve_port}/{APP}"
    serve.delete(APP)


@pytest.fixture(scope="module")
def served(app) -> str:
    return app[0]


@pytest.fixture()
def page(browser, served):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    pg = context.new_page()
    pg.set_default_timeout(GUARD_MS)
    pg.goto(served + "/")
    pg.wait_for_selector("fieldset.prompt-edit")
    yield pg
    context.close()


def classify_in_page(pg, queries: list[str]) -> None:
    pg.fill("#queries", "\n".join(queries))
    pg.focus("#queries")
    pg.keyboard.press("Enter")  # Enter classifies every line
    pg.wait_for_function(f"document.querySelectorAll('.result').length === {len(queries)}")


def test_two_queries_show_every_labels_bar_the_winner_and_the_stages(page, served):
    classify_in_page(page, QUERIES)
    api = httpx.post(f"{served}/v1/classify", json={"queries": QUERIES}, timeout=HANG_GUARD_S).json()["results"]
    cards = page.query_selector_all(".result")
    assert [c.get_attribute("data-query") for c in cards] == QUERIES
    for card, want in zip(cards, api):
        blocks = card.query_selector_all(".prompt-result")
        assert [b.get_attribute("data-prompt") for b in blocks] == [p["prompt"] for p in want["prompts"]]
        for block, p in zip(blocks, want["prompts"]):
            assert block.get_attribute("data-winner") == p["label"]
            bars = {b.get_attribute("data-label"): float(b.get_attribute("data-prob"))
                    for b in block.query_selector_all(".bar")}
            assert bars == pytest.approx({lab["label"]: lab["prob"] for lab in p["labels"]}, abs=1e-4)
            assert block.query_selector(".row.won .name").inner_text() == p["label"]
            assert block.query_selector(".raw") is None  # no head here: no second winner
        stages = [s.get_attribute("data-stage") for s in card.query_selector_all(".stages span")]
        assert "forward" in stages and "tokenize" in stages
    # what `qcls check` knows, beside each prompt: a row per label, the forward's tokens and its T4 projection
    check = httpx.get(f"{served}/v1/check", timeout=HANG_GUARD_S).json()
    editors = page.query_selector_all("fieldset.prompt-edit")
    assert len(editors) == len(check["prompts"])
    for fs, p in zip(editors, check["prompts"]):
        assert len(fs.query_selector_all(".costs tbody tr")) == len(p["labels"])
    forward = page.inner_text("#forward")
    assert f"batch 1: {check['forward'][0]['tokens']} tokens" in forward and "T4 ≈" in forward
    if os.environ.get("QCLS_WRITE_SCREENSHOT") == "1":
        page.set_viewport_size({"width": 1280, "height": 820})
        page.screenshot(path=str(ROOT / "docs" / "playground.png"))


HEADED = {"query": "maxi dress", "ok": True, "error": None, "query_tokens": 3, "batch_size": 1,
          "timings_ms": {"tokenize": 0.1, "prepare": 0.2, "forward": 5.0, "score": 0.3, "postprocess": 0.1,
                         "total": 5.7, "queue_wait": 0.4, "in_replica": 6.2},
          "meta": {}, "prompts": [{"prompt": "category", "label": "dress", "prob": 0.55, "raw_label": "skirt",
                                   "raw_prob": 0.6, "abstained": True, "threshold": 0.7, "labels": [
                                       {"label": "dress", "score": None, "prob": 0.55, "tokens": 2},
                                       {"label": "skirt", "score": None, "prob": 0.45, "tokens": 2}]}]}


def test_a_heads_answer_shows_the_llms_winner_beside_it_and_an_abstention(page):
    """A result of a head (raw winner, no raw scores where the forward stops at its layer) and of an abstention
    threshold, through the page's own renderer."""
    page.evaluate("r => document.querySelector('#results').replaceChildren(renderResult(r))", HEADED)
    block = page.query_selector('.prompt-result[data-prompt="category"]')
    assert block.get_attribute("data-winner") == "dress"
    assert block.query_selector(".raw").inner_text() == "LLM: skirt 60.0%"
    assert block.query_selector(".abstain").inner_text() == "abstained (below 70.0%)"
    assert "no raw score" in block.query_selector(".row.won").get_attribute("title")
    stages = page.query_selector_all(".stages span")
    assert [s.get_attribute("data-stage") for s in stages] == ["queue_wait", "tokenize", "prepare", "forward", "score",
                                                               "postprocess"]


def test_two_identical_labels_are_refused_beside_their_field_and_the_old_prompts_keep_serving(page, served):
    before = httpx.get(f"{served}/v1/prompts", timeout=HANG_GUARD_S).json()["fingerprint"]
    page.fill("#p0-labels", "dress\ndress\nother")
    page.click("#apply")
    page.wait_for_function("document.querySelector('#p0-labels-error').textContent.length > 0")
    assert "duplicate labels ['dress']" in page.inner_text("#p0-labels-error")
    assert page.inner_text("#p0-template-error") == ""
    assert "unchanged" in page.inner_text("#apply-status")
    assert httpx.get(f"{served}/v1/prompts", timeout=HANG_GUARD_S).json()["fingerprint"] == before


def test_an_applied_edit_answers_with_the_new_prompt_and_downloads_as_a_prompt_file(page, served, tmp_path):
    from qcls.config.compose import compose

    page.fill("#p1-name", "season")
    page.fill("#p1-template", "Query: {query}\nThe season this is worn in (summer, winter or none):")
    page.fill("#p1-labels", "summer\nwinter\nnone")
    page.focus("#apply")
    page.keyboard.press("Enter")  # the keyboard alone
    page.wait_for_function("!/^(applying|validating)/.test(document.querySelector('#apply-status').textContent)")
    status = page.inner_text("#apply-status")
    assert status.startswith("serving configuration") and "season" in status, status
    served_now = httpx.get(f"{served}/v1/prompts", timeout=HANG_GUARD_S).json()
    assert [p["name"] for p in served_now["prompts"]][1] == "season"
    page.wait_for_function("document.querySelector('#p1-name') && document.querySelector('#p1-name').value === "
                           "'season' && document.querySelectorAll('fieldset.prompt-edit .costs').length === 2")
    classify_in_page(page, ["thick wool coat"])
    block = page.query_selector('.prompt-result[data-prompt="season"]')
    assert block is not None
    assert [b.get_attribute("data-label") for b in block.query_selector_all(".bar")] == ["summer", "winter", "none"]
    assert block.get_attribute("data-winner") in ("summer", "winter", "none")
    # the download is the file `--config-dir` reads
    page.fill("#set-name", "mine")
    with page.expect_download() as info:
        page.click("#download")
    folder = tmp_path / "conf"
    (folder / "prompts").mkdir(parents=True)
    info.value.save_as(folder / "prompts" / info.value.suggested_filename)
    text = (folder / "prompts" / "mine.yaml").read_text()
    assert text.startswith("# @package _global_\n")
    cfg = compose(["prompts=mine"], config_dir=str(folder))
    assert [p.name for p in cfg.prompts] == [p["name"] for p in served_now["prompts"]]
    assert cfg.prompts[1].template == "Query: {query}\nThe season this is worn in (summer, winter or none):"
    assert cfg.prompts[1].labels == ["summer", "winter", "none"]


def test_the_key_goes_as_a_bearer_token_and_a_narrow_window_has_one_column(browser, app):
    """Through Serve's proxy, under the app's route prefix: the page's requests are relative to it."""
    context = browser.new_context(viewport={"width": 380, "height": 800})
    pg = context.new_page()
    pg.set_default_timeout(GUARD_MS)
    with pg.expect_request(lambda r: "/v1/check" in r.url) as first:
        pg.goto(app[1] + "/")
    pg.wait_for_selector("fieldset.prompt-edit")
    columns = pg.evaluate("getComputedStyle(document.querySelector('main')).gridTemplateColumns.split(' ').length")
    assert columns == 1
    assert pg.evaluate("document.documentElement.scrollWidth") <= 380
    # tab order: the key field, then the query box, its buttons
    pg.focus("#api-key")
    pg.keyboard.type("k3y")
    with pg.expect_request(lambda r: "/v1/check" in r.url) as keyed:
        pg.keyboard.press("Tab")  # leaving the field stores the key and reloads the prompt set with it
    assert pg.evaluate("document.activeElement.id") == "queries"
    pg.keyboard.press("Tab")
    assert pg.evaluate("document.activeElement.id") == "classify"
    assert pg.evaluate("sessionStorage.getItem('qcls.apiKey')") == "k3y"
    assert "authorization" not in first.value.headers and keyed.value.headers["authorization"] == "Bearer k3y"
    assert first.value.url == f"{app[1]}/v1/check"
    context.close()


def test_with_a_key_the_page_is_open_and_its_json_routes_are_not():
    """No browser, no Ray: the API key's middleware over the page's routes."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from qcls.deployments.api_key import PAGE_PATHS, protect
    from qcls.deployments.playground import STATIC, static_text

    app = FastAPI()
    for path in PAGE_PATHS:
        app.get(path)(lambda: "page")
    app.get("/v1/check")(lambda: {})
    app.put("/v1/prompts")(lambda: {})
    protect(app, "s3cret")
    c = TestClient(app)
    assert set(PAGE_PATHS) == {"/", *(f"/static/{name}" for name in STATIC)}
    for path in PAGE_PATHS:
        assert c.get(path).status_code == 200, path
    assert c.get("/v1/check").status_code == 401 and c.put("/v1/prompts").status_code == 401
    assert c.get("/v1/check", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    page = static_text("index.html")
    assert all(f'static/{name}' in page for name in STATIC)  # relative: the page works under a route prefix


class Replica:
    """The parts of a QclsDeployment the playground's routes use: the serving Classifier, its worker and Reloader."""

    def __init__(self, clf):
        from qcls.deployments.reload import Reloader
        from qcls.deployments.worker import EngineWorker

        self.worker, self.replicas = EngineWorker(clf), 1
        self.reloader = Reloader(self.worker, {})
        self.reloader.request(None)  # Serve's reconfigure() at start-up: later requests build in a thread

    @property
    def clf(self):
        return self.worker.clf

    @property
    def cfg(self):  # as deployed with `self.replicas` replicas
        serve = self.clf.cfg.serve.model_copy(update={"num_replicas": self.replicas})
        return self.clf.cfg.model_copy(update={"serve": serve})

    def reload_state(self):
        return self.reloader.state.as_dict()


@pytest.fixture(scope="module")
def tiny_routes(tiny_dirs):
    """The playground's routes over a tiny Qwen3 (real Qwen tokenizer), without Ray; (client, replica)."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from qcls.classifier import Classifier
    from qcls.deployments.playground import add_playground
    from tests.check.test_report import PROMPTS
    from tests.conftest import tiny_cfg

    replica = Replica(Classifier(tiny_cfg(tiny_dirs["qwen3_qwentok"], PROMPTS)))
    app = FastAPI()
    add_playground(app, replica)
    return TestClient(app), replica


def edited(replica, **changes) -> list[dict]:
    out = [p.model_dump() for p in replica.cfg.prompts]
    out[0].update(changes)
    return out


def test_each_problem_comes_back_beside_its_prompt_and_field(tiny_routes):
    client, replica = tiny_routes
    before = replica.clf.fingerprint
    second = dict(edited(replica)[1])
    body = {"prompts": [edited(replica, template="no placeholder", labels=["dress", "dress"])[0],
                        {**second, "label_end": "two words"}, second]}  # (a label_end is tokenized once all parse)
    r = client.put("/v1/prompts", json=body)
    assert r.status_code == 422 and r.json()["ok"] is False
    where = {(e["prompt"], e["field"]) for e in r.json()["errors"]}
    assert where == {(0, "template"), (0, "labels"), (2, "name")}, r.json()
    r = client.put("/v1/prompts", json={"prompts": [edited(replica)[0], {**second, "label_end": "two words"}]})
    assert r.status_code == 422 and [(e["prompt"], e["field"]) for e in r.json()["errors"]] == [(1, "label_end")]
    assert "must be one token" in r.json()["errors"][0]["message"]
    assert client.put("/v1/prompts", json={"prompt": []}).status_code == 422
    assert replica.clf.fingerprint == before  # nothing was built or swapped


def test_a_valid_set_validates_then_serves_and_several_replicas_are_refused(tiny_routes):
    client, replica = tiny_routes
    new = edited(replica, name="kind", labels=["coat", "dress", "other"])
    r = client.put("/v1/prompts", json={"prompts": new, "dry_run": True})
    assert r.status_code == 200 and r.json()["detail"] == "valid" and replica.clf.prompt_names[0] == "category"
    r = client.put("/v1/prompts", json={"prompts": new})
    assert r.status_code == 200 and r.json()["prompts"] == ["kind", "audience"], r.json()
    assert replica.clf.prompt_names == ["kind", "audience"] and r.json()["fingerprint"] == replica.clf.fingerprint
    assert [lab.label for lab in replica.clf.classify(["red coat"])[0].prompts[0].labels] == ["coat", "dress", "other"]
    check = client.get("/v1/check").json()
    assert [lab["label"] for lab in check["prompts"][0]["labels"]] == ["coat", "dress", "other"]
    assert check["limits"]["max_queries_per_request"] == replica.cfg.max_queries_per_request
    replica.replicas = 2
    try:
        r = client.put("/v1/prompts", json={"prompts": edited(replica, name="kind2")})
        assert r.status_code == 409 and "qcls" in r.json()["detail"] and "reload" in r.json()["detail"]
        assert replica.clf.prompt_names == ["kind", "audience"]
    finally:
        replica.replicas = 1
