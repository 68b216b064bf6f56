"""backend=int8 on real weights (the demo models, CPU): how often its answers equal float32's on the shipped dev and
test splits, and what the shipped heads score on int8 states.

    python bench/int8_scores.py --models gemma3_demo smollm2_demo

Per model and split: the LLM's own winner equal to fp32's (every prompt × query; `engine.layer_exit=false`, so the
label scores are computed beside the heads), the shipped head's winner equal to fp32's, the head's accuracy against
the gold labels for both, and max |Δ prob| (LLM and head). Calibration variants: the built-in queries only, and the
dev split's queries as `calibration_queries` (the fitting split: never the test split). A float16 row (weights and
activations in half precision, `backend.dtype=float16`, as a GPU runs fp16) is the reference for what rounding
alone does to the same pairs.

Near-ties: a pair's fp32 margin is its LLM winner's probability minus the runner-up's. The table gives how many of
the LLM's changed winners had a margin under MARGIN in fp32, and the agreement over the pairs whose margin is at
least MARGIN: whether the changes are confined to answers fp32 itself barely decides.
"""
from __future__ import annotations

from pathlib import Path

from bench.common import header, parser, report

DEV = Path(__file__).parents[1] / "qcls" / "data" / "eval" / "ecommerce_dev.jsonl"
TEST = DEV.with_name("ecommerce_test.jsonl")
MARGIN = 0.05


def answers(clf, queries: list[str]) -> list:
    out = []
    for i in range(0, len(queries), 4):
        out += clf.classify(queries[i:i + 4])
    return out


def compare(ref, got, gold: list[dict], prompts: list[str]) -> dict:
    n = llm_eq = head_eq = acc_ref = acc_got = graded = near_flips = clear = clear_eq = 0
    dp_llm = dp_head = 0.0
    for r, g, labels in zip(ref, got, gold):
        for pr, pg in zip(r.prompts, g.prompts):
            n += 1
            llm_eq += pr.raw_label == pg.raw_label
            top = sorted((a.raw_prob for a in pr.labels), reverse=True)
            near = len(top) > 1 and top[0] - top[1] < MARGIN
            near_flips += near and pr.raw_label != pg.raw_label
            clear += not near
            clear_eq += not near and pr.raw_label == pg.raw_label
            head_eq += pr.label == pg.label
            dp_llm = max(dp_llm, max(abs(a.raw_prob - b.raw_prob) for a, b in zip(pr.labels, pg.labels)))
            dp_head = max(dp_head, max(abs(a.prob - b.prob) for a, b in zip(pr.labels, pg.labels)))
            if labels.get(pr.prompt) is not None:
                graded += 1
                acc_ref += pr.label == labels[pr.prompt]
                acc_got += pg.label == labels[pr.prompt]
    return {"n": n, "llm_equal": llm_eq / n, "head_equal": head_eq / n, "acc_fp32": acc_ref / max(graded, 1),
            "acc_int8": acc_got / max(graded, 1), "dprob_llm": dp_llm, "dprob_head": dp_head,
            "llm_flips": n - llm_eq, "near_flips": near_flips, "clear": clear,
            "llm_equal_clear": clear_eq / max(clear, 1)}


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__)
    ap.add_argument("--models", nargs="+", default=["gemma3_demo", "smollm2_demo"])
    ap.add_argument("--limit", type=int, default=None, help="queries per split (smoke runs)")
    ap.add_argument("--tokens", type=int, default=4096, help="backend.options.calibration_tokens")
    args = ap.parse_args(argv)
    from qcls.classifier import Classifier
    from qcls.config.compose import compose
    from qcls.eval.dataset import load_eval_set
    from qcls.progress import set_quiet
    set_quiet(True)
    lines = ["| model | backend, calibration | split | pairs | LLM winner = fp32 | LLM winners changed (of them fp32 "
             f"margin < {MARGIN}) | LLM winner = fp32, margin ≥ {MARGIN} (pairs) | head winner = fp32 | head accuracy "
             "fp32 / this | max \\|Δ prob\\| LLM / head |", "|" + "---|" * 10]
    rows = []
    for model in args.models:
        base = [f"model={model}", "engine.layer_exit=false"]
        ref = Classifier(compose(base + ["backend=fp16"]))
        prompts = [p.name for p in ref.cfg.prompts]
        splits = {name: load_eval_set(path, ref.cfg.prompts, limit=args.limit) for name, path in
                  (("dev", DEV), ("test", TEST))}
        fp = {name: answers(ref, [e.query for e in s.examples]) for name, s in splits.items()}
        int8 = ["backend=int8", f"backend.options.calibration_tokens={args.tokens}"]
        for cal, extra in (("float16 (reference)", ["backend=fp16", "backend.dtype=float16"]),
                           ("int8, built-in queries", int8),
                           ("int8, dev queries", int8 + [f"backend.options.calibration_queries={DEV}"])):
            clf = Classifier(compose(base + extra))
            for name, s in splits.items():
                r = compare(fp[name], answers(clf, [e.query for e in s.examples]), [e.labels for e in s.examples],
                            prompts)
                rows.append({"model": model, "calibration": cal, "split": name, **r})
                lines.append(f"| {model} | {cal} | {name} | {r['n']} | {r['llm_equal']:.3f} | {r['llm_flips']} "
                             f"({r['near_flips']}) | {r['llm_equal_clear']:.3f} ({r['clear']}) | {r['head_equal']:.3f} "
                             f"| {r['acc_fp32']:.3f} / {r['acc_int8']:.3f} | {r['dprob_llm']:.3f} / "
                             f"{r['dprob_head']:.3f} |")
            if clf.notes and "int8" in cal:
                rows[-1]["note"] = clf.notes[0]
                lines.append(f"| | {clf.notes[0]} |" + " |" * 8)
            del clf
    text = header("int8 (W8A8) against float32 on the demo models' real weights, shipped dev and test splits",
                  f"models={args.models}, every prompt of the model's default set, engine.layer_exit=false, "
                  f"the model's shipped head; limit={args.limit}")
    report(text + "\n".join(lines) + "\n", args.no_append, "int8_scores", rows)


if __name__ == "__main__":
    main()
