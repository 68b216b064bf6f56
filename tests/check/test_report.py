"""`qcls check`: label token costs, shared prefix blocks, tokens per forward and every backend's memory fit,
from a model's config and tokenizer alone."""
from __future__ import annotations

import json

import pytest

from qcls.check.report import build, verdict
from qcls.check.text import format_report
from qcls.cli import main
from qcls.config.compose import compose
from qcls.scoring.tokenization import encode
from tests.conftest import prompt, tiny_cfg

HEADER = "You label e-commerce search queries for a shop catalogue. Answer with one label only. " * 3
# With the Qwen tokenizer: " trench coat" = " trench" + " coat"; " t-shirt" and " tshirt" share " t".
PROMPTS = [prompt("category", ["trench", "trench coat", "t-shirt", "tshirt", "dress"], system=HEADER + "Category?"),
           prompt("audience", ["boy", "girl", "man"], system=HEADER + "Audience?")]


@pytest.fixture(scope="module")
def qwen_tiny(tiny_dirs):
    return tiny_dirs["qwen3_qwentok"]


def test_prompt_facts_follow_the_canonical_tokenization(qwen_tiny):
    from transformers import AutoTokenizer
    cfg = tiny_cfg(qwen_tiny, PROMPTS)
    tok = AutoTokenizer.from_pretrained(qwen_tiny)
    rep = build(cfg, query_tokens=5)
    assert rep.problems == [] and verdict(rep) is None
    cat, aud = rep.prompts
    spec = cfg.prompts[0]
    assert cat.prefix_tokens == len(encode(tok, spec.prefix)) and cat.suffix_tokens == len(encode(tok, spec.suffix))
    ids = {lab.label: encode(tok, " " + lab.label) for lab in cat.labels}
    assert {lab.label: lab.tokens for lab in cat.labels} == {k: len(v) for k, v in ids.items()}
    # The header is identical for several 16-token blocks: those are shared, the rest is not.
    assert cat.shared_prefix_tokens == aud.shared_prefix_tokens > 0
    assert cat.shared_prefix_tokens % cfg.engine.prefix_block_size == 0
    assert cat.shared_prefix_tokens < min(cat.prefix_tokens, aud.prefix_tokens)
    # Single-token cost exactly when no other label shares the label's first token (and it extends none).
    for lab in cat.labels:
        alone = all(v[0] != ids[lab.label][0] for k, v in ids.items() if k != lab.label)
        assert lab.single_token_cost == alone, lab
    assert all(lab.single_token_cost for lab in aud.labels if lab.tokens == 1)


def test_a_label_that_others_extend_names_its_end_token(qwen_tiny):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(qwen_tiny)
    rep = build(tiny_cfg(qwen_tiny, PROMPTS), query_tokens=5)
    cat = rep.prompts[0]
    costs = {lab.label: lab for lab in cat.labels}
    assert costs["trench"].extended_by == ["trench coat"] and not costs["trench"].single_token_cost
    assert costs["trench"].trie_reads == 2  # " trench" at the root, then the end token against " coat"
    assert costs["trench coat"].tokens == 2 and costs["dress"].single_token_cost
    assert cat.end_token == tok.decode([tok.eos_token_id])
    assert "a token-prefix of trench coat" in format_report(rep)


def test_tokens_per_forward_match_the_engine(qwen_tiny):
    from qcls.classifier import Classifier
    cfg = tiny_cfg(qwen_tiny, PROMPTS, engine={"max_batch_size": 2})
    clf = Classifier(cfg)
    query = "red summer dress"
    n = len(encode(clf.tokenizer, query))
    rep = build(cfg, query_tokens=n)
    assert [f.batch for f in rep.forward] == [1, 2]
    for f in rep.forward:
        res = clf.classify([query] * f.batch)
        assert res[0].meta["tokens_per_forward"] == f.bucket_tokens
        assert f.tokens <= f.bucket_tokens
    assert rep.prefix_pool_tokens == clf.engine.pool.n_slots


def test_label_collisions_are_reported_for_every_prompt(qwen_tiny):
    bad = [prompt("category", ["trench", "trench coat", "dress"]), prompt("style", ["t-shirt", "tshirt", "polo"])]
    rep = build(tiny_cfg(qwen_tiny, bad, force_single_token_labels=True), query_tokens=4)
    err = verdict(rep)
    assert err is not None and len(rep.problems) == 2
    assert "prompt 'category'" in str(err) and "prompt 'style'" in str(err) and "scoring=trie" in str(err)


def test_a_calibration_file_is_checked_against_the_config(qwen_tiny, tmp_path):
    from qcls.heads import files
    from qcls.heads.head import Head, PromptHead
    ok = Head({"audience": PromptHead.temperature_bias(["boy", "girl", "man"], 2.0, [0.0, 0.1, -0.1])},
              "temperature_bias", {"strategy": "trie", "model": "tiny"})
    files.save(ok, tmp_path / "ok.yaml")
    rep = build(tiny_cfg(qwen_tiny, PROMPTS, calibration=str(tmp_path / "ok.yaml")), query_tokens=4)
    assert rep.problems == [] and rep.head["prompts"] == {"audience": "raw scores (affine)"}
    assert any("no entry for prompts ['category']" in n for n in rep.head["notes"])
    text = format_report(rep)
    assert (f"answers per prompt: category: LLM scores (no head in the file), audience: head; head file "
            f"{tmp_path / 'ok.yaml'}\n  reads (temperature_bias): audience: raw scores (affine)") in text
    bad = Head({"audience": PromptHead.temperature_bias(["boy", "girl", "woman"], 2.0, [0.0, 0.1, -0.1])},
               "temperature_bias", {"strategy": "trie", "model": "tiny"})
    files.save(bad, tmp_path / "bad.yaml")
    rep = build(tiny_cfg(qwen_tiny, PROMPTS, calibration=str(tmp_path / "bad.yaml")), query_tokens=4)
    assert rep.head is None and verdict(rep) is not None
    assert "missing from the file: ['man'], not in the config: ['woman']" in str(verdict(rep))
    # the same file as the model's default head (calibration=model): no prompt fits it, nothing is refused
    model = {"name": "tiny", "source": "local", "path": qwen_tiny, "head": str(tmp_path / "bad.yaml")}
    rep = build(tiny_cfg(qwen_tiny, PROMPTS, calibration="model", model=model), query_tokens=4)
    assert rep.problems == [] and rep.head["default"] and rep.head["with_head"] == []
    assert rep.head["own_scores"] == {"audience": "its head was fitted for another label set",
                                      "category": "no head in the file"}
    assert ("answers per prompt: category: LLM scores (no head in the file), audience: LLM scores (its head was fitted "
            f"for another label set); the model's default head {tmp_path / 'bad.yaml'}") in format_report(rep)


def test_qwen3_8b_on_a_t4_without_weights(qwen3_8b_dir, capsys):
    over = ["model=qwen3_8b", "model.source=local", f"model.path={qwen3_8b_dir}", "gpu=t4"]
    rc = main(["check", *over])
    out, err = capsys.readouterr()
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ") and "GiB" not in line
            and line.split() and line.split()[0] in ("fp16", "fp16-offload", "bnb-int8", "bnb-nf4", "gptq")}
    assert "does NOT fit" in rows["fp16"]
    assert all(rows[b].split()[-1] == "fits" or "fits" in rows[b] and "NOT" not in rows[b]
               for b in ("fp16-offload", "bnb-int8", "bnb-nf4"))
    assert "budget 15.00 GiB" in out and "36 layers" in out
    # the default backend (fp16) would be refused at start-up: the same message, exit status 2
    assert rc == 2 and "qcls: error:" in err and "backend=fp16 needs an estimated" in err
    assert "backend=bnb-nf4" in err and "Traceback" not in err

    assert main(["check", "--json", *over, "backend=bnb-nf4"]) == 0
    rep = json.loads(capsys.readouterr().out)
    fits = {b["backend"]: b["fits"] for b in rep["backends"]}
    assert fits["fp16"] is False and fits["fp16-offload"] and fits["bnb-int8"] and fits["bnb-nf4"]
    assert rep["model_config"]["hidden_size"] == 4096 and rep["budget_gib"] == 15.0
    offload = next(b for b in rep["backends"] if b["backend"] == "fp16-offload")
    assert offload["layers_on_gpu"] == offload["n_layers"] == 36 and offload["weights_cpu_gib"] > 2


def test_query_tokens_beyond_the_config_are_refused(qwen3_8b_dir, capsys):
    rc = main(["check", "--query-tokens", "999", "model=qwen3_8b", "model.source=local",
               f"model.path={qwen3_8b_dir}"])
    assert rc == 2 and "max_query_tokens=64" in capsys.readouterr().err


def test_demo_model_config_is_read_from_the_gguf_header_without_converting(tmp_path, monkeypatch):
    from qcls.backends import sources
    monkeypatch.setattr(sources, "convert_gguf", lambda *a: pytest.fail("check must not convert weights"))
    cfg = compose(["model=smollm2_demo", "prompts=default", f"cache_dir={tmp_path}"])  # an empty cache: nothing converted yet
    src = sources.config_source(cfg.model, cfg.cache_dir)
    from qcls.backends import demos
    assert src.gguf_file == demos.get("smollm2_demo").file
    import gguf
    parses, reader = [], gguf.GGUFReader
    monkeypatch.setattr(gguf, "GGUFReader", lambda *a, **k: parses.append(a) or reader(*a, **k))
    rep = build(cfg)
    assert len(parses) == 1  # the config and the tokenizer from one read of the header
    assert rep.model_config["vocab_size"] == 49152 and rep.model_config["num_hidden_layers"] == 30
    assert [p.name for p in rep.prompts] == ["category", "audience"] and rep.budget_gib is None
    assert all(b.fits is None for b in rep.backends) and "no budget" in format_report(rep)
