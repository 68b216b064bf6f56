"""The playground's results say per prompt what answered it, its head or the LLM's own label scores, and a prompt
whose head no longer fits it (a label renamed) says so beside its answer with the way back: the page's own renderer
in a real browser, on the page's script alone (no server)."""
from __future__ import annotations

import pytest

from qcls.deployments.playground import static_text
from qcls.heads.startup import OTHER_LABELS, lost_head
from tests.deployments.test_playground import GUARD_MS, HEADED, browser  # noqa: F401 (the browser fixture)

pytestmark = pytest.mark.slow


@pytest.fixture()
def page(browser):  # noqa: F811
    context = browser.new_context()
    pg = context.new_page()
    pg.set_default_timeout(GUARD_MS)
    pg.set_content(static_text("index.html").replace('<script src="static/playground.js" defer></script>', ""))
    pg.add_script_tag(content=static_text("playground.js"))  # after DOMContentLoaded: nothing is fetched
    yield pg
    context.close()


def shown(page, result: dict):
    page.evaluate("r => document.querySelector('#results').replaceChildren(renderResult(r))", result)
    return page.query_selector('.prompt-result[data-prompt="category"]')


def test_each_prompt_says_what_answered_it_and_a_lost_head_the_way_back(page):
    block = shown(page, {**HEADED, "meta": {"heads": {"with_head": ["category"], "lost": {}}}})
    assert block.get_attribute("data-answered-by") == "head" and block.query_selector(".by").inner_text() == "head"
    assert block.query_selector(".lost-head") is None
    note = lost_head(OTHER_LABELS)  # a label renamed: the file's head for the prompt no longer fits it
    block = shown(page, {**HEADED, "meta": {"heads": {"with_head": [], "lost": {"category": note}}}})
    assert block.get_attribute("data-answered-by") == "llm" and block.query_selector(".by").inner_text() == "LLM scores"
    assert block.query_selector(".lost-head").inner_text() == note and "restore the labels" in note
    assert shown(page, {**HEADED, "meta": {}}).query_selector(".by") is None  # a result that does not say
