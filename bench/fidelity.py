"""How close fp16 scores come to the float32 truth, the fast engine against plain transformers (GPU; not a test).

One random-weight model in float32 (the truth) and its float16 copy, the final norm scaled ×20 so that logits
are as sharp as a trained model's, `prompts=ecommerce8` and the first N queries of the shipped dev split. Each
part (strategies, heads) is appended to bench/RESULTS.md as soon as it is measured.
"""
from __future__ import annotations

import copy
import time

import numpy as np
import torch

from bench import common as C
from qcls.classifier import Classifier
from qcls.config.compose import compose
from qcls.fitting.calibrate import split_path
from qcls.eval.dataset import load_eval_set
from qcls.heads import weights_fingerprint as fp
from qcls.heads.head import Read
from qcls.testing.qwen_tokenizer import build_qwen_tokenizer
from qcls.scoring.reference import reference_label_scores
from qcls.scoring.tokenization import encode_query

STRATEGIES = ("trie", "exact", "mean_logprob")


def overrides(model: str, extra=()) -> list[str]:
    return [f"model={C.family(model)}", f"model.name=random_{model}", "model.source=local", "model.path=random-weights",
            "prompts=ecommerce8", "engine.query_buckets=[8,16,32]", "max_query_tokens=32", *extra]


def reference_all(model, layouts, ids_list) -> dict[str, list]:
    """Scores of every strategy from one set of plain forwards per (query, prompt, label): [query][prompt][label]."""
    per = [[reference_label_scores(model, lay.tokens, lay.trie, ids) for lay in layouts] for ids in ids_list]
    return {s: [[p[s] for p in q] for q in per] for s in STRATEGIES}


def fast_all(loaded, queries, model: str) -> dict[str, list]:
    out = {}
    for s in STRATEGIES:
        clf = Classifier(compose(overrides(model, [f"scoring={s}"])), loaded=loaded)
        out[s] = C.scores(clf.classify(queries))
        del clf
    return out


def disagreements(fast, hf, truth) -> list[dict]:
    """Every (query, prompt) where fast fp16 or transformers fp16 picks another winner than fp32, with fp32's
    margin (its winner's score minus the runner-up's): a margin below fp16's score error is a coin toss for
    any fp16 forward."""
    out = []
    for qi, (fq, hq, tq) in enumerate(zip(fast, hf, truth)):
        for pi, (f, h, t) in enumerate(zip(fq, hq, tq)):
            w = int(np.argmax(t))
            if int(np.argmax(f)) != w or int(np.argmax(h)) != w:
                top2 = sorted(t, reverse=True)[:2]
                out.append({"query": qi, "prompt": pi, "fp32_winner": w, "fast_winner": int(np.argmax(f)),
                            "hf_winner": int(np.argmax(h)), "fp32_margin": float(top2[0] - top2[1]),
                            "fast_error": float(max(abs(a - b) for a, b in zip(f, t))),
                            "hf_error": float(max(abs(a - b) for a, b in zip(h, t)))})
    return out


def heads(loaded16, loaded32, queries, n_layers, model: str) -> list[dict]:
    cfg = compose(overrides(model))
    out = []
    for read, with_scores in ((Read("final"), False), (Read(n_layers // 2, "both"), True)):
        # weights scaled to the state's size so that head logits spread over a few units (probabilities far
        # from uniform): N(0, 1/(sqrt(F)·rms(state)))
        probe = Classifier(cfg, loaded=loaded16, taps=read.taps)
        _, st = probe.read_states(queries[:2])
        rms = float(torch.stack(st).float().pow(2).mean().sqrt())
        del probe
        width = fp.hidden_size(loaded16.model.config) * len(read.taps)
        path = C.random_head_file(loaded16.model, cfg, read, with_scores, 0, 2.0 / (width ** 0.5 * rms))
        fast = Classifier(compose(overrides(model, [f"calibration={path}"])), loaded=loaded16)
        ref_cfg = compose(overrides(model, [f"calibration={path}", "engine=reference"]))
        ref, hf = Classifier(ref_cfg, loaded=loaded32), Classifier(ref_cfg, loaded=loaded16)
        got, want, hf16 = fast.classify(queries), ref.classify(queries), hf.classify(queries)
        d, d_hf, same, same_hf, spread = 0.0, 0.0, [], [], []
        for g, w, h in zip(got, want, hf16):
            for gp, wp, hp in zip(g.prompts, w.prompts, h.prompts):
                d = max(d, max(abs(a.prob - b.prob) for a, b in zip(gp.labels, wp.labels)))
                d_hf = max(d_hf, max(abs(a.prob - b.prob) for a, b in zip(hp.labels, wp.labels)))
                same.append(gp.label == wp.label)
                same_hf.append(hp.label == wp.label)
                spread.append(wp.prob)
        out.append({"read": f"{read.kind}@{read.layer}", "scores": with_scores, "max_abs_prob_diff": d,
                    "hf_max_abs_prob_diff": d_hf, "winners_equal": float(np.mean(same)),
                    "hf_winners_equal": float(np.mean(same_hf)), "mean_winner_prob": float(np.mean(spread))})
        del fast, ref, hf
        C.free()
    return out


def main() -> None:
    ap = C.parser(__doc__)
    ap.add_argument("--model", default="qwen3_4b", choices=sorted(C.SHAPES))
    ap.add_argument("--queries", type=int, default=16)
    ap.add_argument("--head-queries", type=int, default=6)
    ap.add_argument("--sharpen", type=float, default=20.0, help="final norm weight factor")
    ap.add_argument("--parts", nargs="+", choices=["strategies", "heads"], default=["strategies", "heads"],
                    help="which comparisons to run, in this order (each appends its table)")
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    model32 = C.random_model(args.model, dev, torch.float32, seed=0)
    with torch.no_grad():
        model32.model.norm.weight.mul_(args.sharpen)
    model16 = copy.deepcopy(model32).half() if dev == "cuda" else copy.deepcopy(model32)
    tok = build_qwen_tokenizer()
    loaded16, loaded32 = C.loaded(model16, tok), C.loaded(model32, tok)
    data = load_eval_set(split_path("dev"), compose(overrides(args.model)).prompts, None)
    queries = data.queries[:args.queries]
    layouts = Classifier(compose(overrides(args.model)), loaded=loaded16).layouts
    ids = [encode_query(tok, q, 32) for q in queries]
    r = {"model": args.model, "queries": len(queries), "sharpen": args.sharpen, "strategies": {}, "parts": args.parts}
    n_layers = model32.config.num_hidden_layers
    for part in args.parts:  # in the order given: what a time limit cuts off is the last
        if part == "strategies":
            strategies(r, model32, model16, loaded16, layouts, ids, queries, args)
        else:
            r["heads"] = heads(loaded16, loaded32, queries[:args.head_queries], n_layers, args.model)
        report(r, part, t0, args.no_append)


def strategies(r, model32, model16, loaded16, layouts, ids, queries, args) -> None:
    truth = reference_all(model32, layouts, ids)
    fast16 = fast_all(loaded16, queries, args.model)
    hf16 = reference_all(model16, layouts, ids)
    for s, t in truth.items():
        flips = disagreements(fast16[s], hf16[s], t)
        r["strategies"][s] = {"fast_fp16": C.score_diff(fast16[s], t), "hf_fp16": C.score_diff(hf16[s], t),
                              "hf_winner_equal_but_fast_not": sum(f["fast_winner"] != f["fp32_winner"] for f in flips
                                                                  if f["hf_winner"] == f["fp32_winner"]),
                              "disagreements": flips}


def report(r: dict, part: str, t0: float, no_append: bool) -> None:
    r["seconds"] = round(time.perf_counter() - t0, 1)
    text = "" if r.pop("_headed", False) else C.header(
        f"fidelity: fp16 against fp32 ({r['model']} random weights, final norm ×{r['sharpen']})",
        f"bench/fidelity.py --model {r['model']} --queries {r['queries']} --parts {' '.join(r['parts'])}; "
        "prompts=ecommerce8 (8 prompts, 2 with Chinese multi-token labels); first queries of "
        "qcls/data/eval/ecommerce_dev.jsonl")
    r["_headed"] = True
    if part == "strategies":
        text += ("| strategy | fast fp16 max \\|Δ score\\| | transformers fp16 max \\|Δ score\\| | fast / transformers | "
                 "winners = fp32 fast / transformers | fp32 winner kept by transformers but not by fast |"
                 "\n|---|---|---|---|---|---|\n")
        for s, v in r["strategies"].items():
            f, h = v["fast_fp16"], v["hf_fp16"]
            text += (f"| {s} | {f['max_abs_diff']:.4f} | {h['max_abs_diff']:.4f} | "
                     f"{f['max_abs_diff'] / max(h['max_abs_diff'], 1e-12):.2f} | {f['winners_equal']:.3f} / "
                     f"{h['winners_equal']:.3f} | {v['hf_winner_equal_but_fast_not']} |\n")
        flips = [(s, f) for s, v in r["strategies"].items() for f in v["disagreements"]]
        if flips:
            text += ("\nWinners unlike fp32's (query, prompt: fp32 margin between its top two labels; each fp16 "
                     "forward's winner and largest score error on that prompt):\n\n" + "".join(
                         f"- {s}: query {f['query']}, prompt {f['prompt']}: margin {f['fp32_margin']:.4f}; fast "
                         f"{'=' if f['fast_winner'] == f['fp32_winner'] else '≠'} (error {f['fast_error']:.4f}), "
                         f"transformers {'=' if f['hf_winner'] == f['fp32_winner'] else '≠'} (error "
                         f"{f['hf_error']:.4f})\n" for s, f in flips))
    else:
        text += ("\nLearned head (random weights scaled to the state), the same head file on the fast fp16 engine and on "
                 "transformers fp16 (engine=reference), each against the fp32 reference engine:\n\n| read | + raw scores "
                 "| fast fp16 max \\|Δ prob\\| | transformers fp16 max \\|Δ prob\\| | winners equal fast / transformers "
                 "| mean winner prob |\n|---|---|---|---|---|---|\n")
        for h in r["heads"]:
            text += (f"| {h['read']} | {h['scores']} | {h['max_abs_prob_diff']:.2e} | {h['hf_max_abs_prob_diff']:.2e} | "
                     f"{h['winners_equal']:.3f} / {h['hf_winners_equal']:.3f} | {h['mean_winner_prob']:.3f} |\n")
        text += f"\n{r['seconds']} s in all.\n"
    C.report(text, no_append, f"fidelity_{'_'.join(r['parts'])}", {k: v for k, v in r.items() if k[0] != "_"})

if __name__ == "__main__":
    main()
