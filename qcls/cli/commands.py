"""qcls command line: classify, repl, serve, reload, check, bulk (and sweep, calibrate, label-next, audit: commands
that parse their own arguments, routed before argparse). A thin layer over Classifier.

Hydra overrides (`model=qwen3_4b scoring=exact engine.max_batch_size=2`) may be mixed with queries: an
argument of the form key=value is an override; put queries that look like one after `--`.
Start-up errors print one `qcls: error: …` paragraph and exit with status 2; an unexpected exception prints
one `qcls: internal error: …` line and exits with status 1 (qcls/errors.py); `--debug` or QCLS_DEBUG=1 adds
the traceback.
"""
from __future__ import annotations

import argparse
import json
import sys

from qcls.config.overrides import split_args
from qcls.errors import run_guarded
from qcls.results import STAGES, QueryResult

EPILOG = """examples:
  qcls classify "mens slim fit jeans" "夏季女士碎花连衣裙"
  qcls --config-dir ./myconf classify prompts=my_prompts "red dress"   # your own prompts/my_prompts.yaml
  qcls classify prompts=./my_prompts.yaml "red dress"                  # the same file given by path
  qcls classify --json "hoodie for boys" scoring=exact
  qcls classify model=qwen3_4b model.source=local model.path=/models/Qwen3-4B "slim jeans"
  echo "summer dress" | qcls repl
  qcls bulk queries.csv --out predictions.parquet prompts=ecommerce8 --all-labels   # a file in, a file out
  qcls serve model=qwen3_4b serve.num_gpus=1
  qcls reload model=qwen3_4b serve.num_gpus=1 prompts=ecommerce8_fewshot   # the running app, no restart
  qcls check model=qwen3_8b model.source=local model.path=/models/Qwen3-8B gpu=t4   # no weights, no GPU
  qcls sweep -m scoring=trie,first_token,exact eval=dev          # qcls sweep --help
  qcls calibrate prompts=ecommerce8                               # qcls calibrate --help
  qcls label-next logs/ calibration=heads/mine.yaml --labelled labelled.csv   # qcls label-next --help
  qcls audit my_labels.csv                                        # probably wrong labels: qcls audit --help

{groups}

errors: a start-up problem (config, model source, network, memory budget, missing optional package, label
collisions) prints one `qcls: error:` paragraph with the way out and exits 2; `qcls --debug …` (or
QCLS_DEBUG=1) adds the traceback. `qcls check` shows label token costs and every backend's memory fit."""

# commands that parse their own command line (sweep is a Hydra app)
ROUTED = {"sweep": "qcls.sweep.sweep", "calibrate": "qcls.fitting.calibrate", "label-next": "qcls.cli.label_next",
          "audit": "qcls.fitting.audit"}
ROUTED_HELP = {"label-next": "the queries of a log or file most worth labelling next for a head, as a CSV to fill in",
               "audit": "the labels of a labelled file that a held-out head finds unlikely, most doubtful first"}


def format_result(r: QueryResult, top: int = 3) -> str:
    if not r.ok:
        return f"query: {r.query!r}\n  ERROR: {r.error}\n"
    t = r.timings_ms
    stages = " · ".join(f"{s} {t[s]:.2f}" for s in STAGES)
    lines = [f"query: {r.query}  ({r.query_tokens} tokens, batch {r.batch_size}, {t['total']:.2f} ms: {stages})"]
    width = max(len(p.prompt) for p in r.prompts)
    heads = r.meta.get("heads") or {}
    for p in r.prompts:  # with a head or calibration loaded, its probabilities are the ones reported
        others = ", ".join(f"{s.label} {s.prob:.3f}" for s in p.top(top + 1) if s.label != p.label)[:80]
        raw = f"   (raw scores: {p.raw_label} {p.raw_prob:.3f})" if p.raw_label is not None else ""
        by = "[head]" if p.prompt in heads.get("with_head", ()) else "[LLM] "  # what answered this prompt
        if p.abstained:  # below its threshold: no winner (or the fallback), every label's probability listed
            others = ", ".join(f"{s.label} {s.prob:.3f}" for s in p.top(top + 1))[:80]
            shown = "ABSTAINED" + (f" → {p.label}" if p.label is not None else "")
            lines.append(f"  {p.prompt:<{width}}  {by} {shown}   | {others}{raw}")
        else:
            lines.append(f"  {p.prompt:<{width}}  {by} {p.label:<10} {p.prob:.3f}   | {others}{raw}")
        if p.prompt in heads.get("lost", {}):  # its head no longer fits it (qcls/heads/startup.py: lost_head)
            lines.append(f"  {'':<{width}}  note: {heads['lost'][p.prompt]}")
    return "\n".join(lines) + "\n"


def _emit(results: list[QueryResult], as_json: bool, out=None) -> None:
    out = out or sys.stdout  # looked up per call: an in-process caller may have redirected it
    for r in results:
        out.write(json.dumps(r.to_dict(), ensure_ascii=False) + "\n" if as_json else format_result(r))
    out.flush()


def _classifier(overrides: list[str]):
    from qcls.classifier import Classifier
    from qcls.config.compose import compose
    return Classifier(compose(overrides))


def cmd_classify(args: argparse.Namespace) -> int:
    queries, overrides = split_args(args.items, args.literal)
    if not queries:
        print("qcls classify: give at least one query", file=sys.stderr)
        return 2
    from qcls.heads.thresholds import startup_line
    clf = _classifier(overrides)
    if (line := startup_line(clf.head, clf.prompt_names)) is not None:  # stderr, beside the start-up lines
        print(line, file=sys.stderr)
    results = clf.classify(queries)
    _emit(results, args.json)
    return 0 if all(r.ok for r in results) else 1


def cmd_repl(args: argparse.Namespace) -> int:
    _, overrides = split_args(args.items)
    clf = _classifier(overrides)
    interactive = sys.stdin.isatty()
    if interactive:
        print("qcls: type a query per line; Ctrl-D ends.", file=sys.stderr)
    for line in sys.stdin:
        query = line.rstrip("\n")
        if not query.strip() and not interactive:
            continue
        _emit(clf.classify([query]), args.json)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    _, overrides = split_args(args.items)
    from qcls.cli.serve import serve_main
    return serve_main(overrides) or 0


def cmd_reload(args: argparse.Namespace) -> int:
    _, overrides = split_args(args.items)
    from qcls.cli.reload import reload_main
    return reload_main(overrides)


def cmd_check(args: argparse.Namespace) -> int:
    stray, overrides = split_args(args.items, args.literal)
    if stray:
        raise ValueError(f"qcls check takes overrides only (key=value), not {stray}")
    from qcls.check.report import build, verdict
    from qcls.check.text import format_report
    from qcls.config.compose import compose
    rep = build(compose(overrides), args.query_tokens)
    sys.stdout.write(json.dumps(rep.to_dict(), ensure_ascii=False) + "\n" if args.json else format_report(rep))
    sys.stdout.flush()
    err = verdict(rep)
    if err is not None:
        raise err
    return 0


def cmd_bulk(args: argparse.Namespace) -> int:
    stray, overrides = split_args(args.items, args.literal)
    if len(stray) + (args.out is not None) != 2 or not stray:
        raise ValueError(f"qcls bulk takes INPUT, then OUTPUT or --out OUTPUT (not both), and overrides (key=value); "
                         f"got {stray}" + (f" and --out {args.out}" if args.out is not None else ""))
    from qcls.bulk.options import BulkOptions
    output = args.out if args.out is not None else stray[1]
    opts = BulkOptions(stray[0], output, overrides, column=args.column, all_labels=args.all_labels,
                       quiet=args.quiet, ray=args.ray, actors=args.actors, address=args.address,
                       shuffle=False if args.no_shuffle else None,
                       **{k: v for k, v in (("batch_size", args.batch_size), ("chunk_rows", args.chunk_rows),
                                            ("cache_size", args.cache_size)) if v is not None})
    if opts.ray or opts.address:
        from qcls.bulk.ray_runner import run
    else:
        from qcls.bulk.runner import run
    out = run(opts)
    return 0 if out["rows"] == 0 or sum(out["errors"].values()) < out["rows"] else 1


def groups_text() -> str:
    """The config groups and their options as this process sees them (the user's folders included)."""
    import textwrap

    from qcls.config.paths import group_options
    groups = ", ".join(f"{g} ({', '.join(group_options(g))})" for g in
                       ("model", "prompts", "backend", "scoring", "engine", "serve", "gpu", "eval"))
    return textwrap.fill(f"config groups: {groups}; keys such as force_single_token_labels=true, "
                         "max_query_tokens=N, cache_dir=DIR, engine.layer_exit=false (every layer runs and the LLM's "
                         "own scores show beside a head's; by default the forward stops at the deepest layer the heads "
                         "read). See README.md.", 110)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="qcls", description="Classify search queries with N prompts in one LLM "
                                 "forward.", epilog=EPILOG.format(groups=groups_text()), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--debug", action="store_true", help="print the traceback of an error (or QCLS_DEBUG=1)")
    ap.add_argument("--version", action="store_true", help="print the version (and the commit in a checkout)")
    ap.add_argument("--config-dir", "-cd", metavar="DIR", action="append", help="a folder of your own config "
                    "groups (DIR/prompts/NAME.yaml, DIR/model/…), in front of the shipped ones; repeatable; or "
                    "QCLS_CONFIG_DIR. A group may also be a file: prompts=./my_prompts.yaml")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("classify", help="classify queries given as arguments",
                       description="Classify each query under every prompt; key=value items are Hydra overrides.")
    c.add_argument("--json", action="store_true", help="one JSON object per query on stdout")
    c.add_argument("items", nargs="*", metavar="QUERY|OVERRIDE")
    c.set_defaults(fn=cmd_classify)
    r = sub.add_parser("repl", help="load once, then classify each line of standard input",
                       description="Load once, then classify each stdin line as it comes; EOF ends.")
    r.add_argument("--json", action="store_true", help="one JSON object per query on stdout")
    r.add_argument("items", nargs="*", metavar="OVERRIDE")
    r.set_defaults(fn=cmd_repl)
    s = sub.add_parser("serve", help="start the Ray Serve deployment (HTTP + handles)",
                       description="Start the Ray Serve app on this machine with the given overrides.")
    s.add_argument("items", nargs="*", metavar="OVERRIDE")
    s.set_defaults(fn=cmd_serve)
    rl = sub.add_parser("reload", help="give a running `qcls serve` new prompts, a head or limits without a restart",
                        description="The whole configuration, as for `qcls serve` (the same overrides and "
                        "--config-dir, with the changes); every replica builds it beside the serving one and swaps. "
                        "Exit 2 with the reason when refused (the old configuration keeps serving).")
    rl.add_argument("items", nargs="*", metavar="OVERRIDE")
    rl.set_defaults(fn=cmd_reload)
    k = sub.add_parser("check", help="labels' token costs, tokens per forward, every backend's memory fit "
                       "(no weights, no GPU)", description="Validate the config and label sets and estimate what "
                       "it costs, reading only the model's config and tokenizer.")
    k.add_argument("--json", action="store_true", help="one JSON object on stdout")
    k.add_argument("--query-tokens", type=int, default=8, metavar="N", help="query length for tokens per "
                   "forward (default 8)")
    k.add_argument("items", nargs="*", metavar="OVERRIDE")
    k.set_defaults(fn=cmd_check)
    b = sub.add_parser("bulk", help="classify a file of queries into a file of results (docs/bulk.md)",
                       description="Classify every row of INPUT (.txt one query a line, .csv/.tsv with a query "
                       "column, .jsonl, .parquet) into OUTPUT (.jsonl, .csv, .tsv or .parquet): each distinct query "
                       "once, bad rows as error rows, resumable after a kill (same command again).")
    b.add_argument("--out", metavar="OUTPUT", help="the output file (or give it after INPUT)")
    b.add_argument("--column", help="the query column or key (default: query)")
    b.add_argument("--all-labels", action="store_true", help="every label's probability, not only the winner's")
    b.add_argument("--quiet", action="store_true", help="no progress line and no summary on stderr")
    b.add_argument("--batch-size", type=int, metavar="N", help="engine.max_batch_size for this run (default: 8 on "
                   "a GPU, the config's on the CPU)")
    b.add_argument("--chunk-rows", type=int, metavar="N", help="rows per part file (default 65536)")
    b.add_argument("--cache-size", type=int, metavar="N", help="distinct results kept (default 1,000,000)")
    b.add_argument("--ray", action="store_true", help="run through Ray Data (OUTPUT becomes a folder of files)")
    b.add_argument("--actors", type=int, default=1, metavar="N", help="Ray actors, one Classifier each (one GPU "
                   "each on GPUs)")
    b.add_argument("--address", metavar="A", help="an existing Ray cluster (implies --ray), e.g. auto")
    b.add_argument("--no-shuffle", action="store_true", help="with several actors, stream the rows to them in "
                   "input order instead of sending each distinct query to one actor (each then dedupes only its own)")
    b.add_argument("items", nargs="*", metavar="INPUT [OUTPUT]|OVERRIDE")
    b.set_defaults(fn=cmd_bulk)
    for name in ROUTED:
        sub.add_parser(name, help=ROUTED_HELP.get(name, f"see qcls {name} --help"), add_help=False)
    return ap


def version_text() -> str:
    """The installed version, and the commit when qcls runs from a git checkout."""
    from qcls import __version__
    from qcls.sweep.timing import commit
    sha = commit()
    return f"qcls {__version__}" + (f" (commit {sha})" if sha != "unknown" else "")


def take_config_dirs(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the `--config-dir DIR` / `--config-dir=DIR` values, argv without them), wherever they stand."""
    dirs, rest, i = [], [], 0
    while i < len(argv):
        a = argv[i]
        if a in ("--config-dir", "-cd"):
            if i + 1 >= len(argv):
                raise ValueError("--config-dir needs a folder")
            dirs.append(argv[i + 1])
            i += 2
            continue
        if a.startswith("--config-dir="):
            dirs.append(a.split("=", 1)[1])
        else:
            rest.append(a)
        i += 1
    return dirs, rest


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    literal = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    if argv[:1] == ["--version"]:
        print(version_text())
        return 0
    # the user's config folders (and group=FILE.yaml overrides) hold for every command, the Hydra apps included,
    # through QCLS_CONFIG_DIR; put back as it was when the command returns (main() also runs inside a process)
    import os

    from qcls.config.paths import ENV_CONFIG_DIR
    saved = os.environ.get(ENV_CONFIG_DIR)
    try:
        return _main(argv, literal, debug)
    finally:
        if saved is None:
            os.environ.pop(ENV_CONFIG_DIR, None)
        else:
            os.environ[ENV_CONFIG_DIR] = saved


def _main(argv: list[str], literal: list[str], debug: bool) -> int:
    config_dirs, argv = take_config_dirs(argv)

    def user_config() -> int:
        from qcls.config.compose import export_user_config
        argv[:] = export_user_config(config_dirs, argv)
        return 0
    if run_guarded(user_config, debug) != 0:
        return 2
    if argv and argv[0] in ROUTED:  # Hydra apps parse their own command line
        import importlib
        rest = argv[1:] + (["--", *literal] if literal else [])
        return run_guarded(lambda: importlib.import_module(ROUTED[argv[0]]).main(rest), debug, f"qcls {argv[0]}")
    parser = build_parser()
    # Options may follow queries (`classify "red dress" --json`): argparse leaves such queries unparsed.
    args, rest = parser.parse_known_args(argv)
    bad = [r for r in rest if r.startswith("-")]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)} (a query starting with '-' goes after --)")
    args.items = list(args.items) + rest
    args.literal = literal
    return run_guarded(lambda: args.fn(args), debug)


if __name__ == "__main__":
    sys.exit(main())
