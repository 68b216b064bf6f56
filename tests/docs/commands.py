"""Checking a documented `qcls …` command line without running it: its options parse as the CLI parses them and
its overrides compose and validate into a config (no weights, tokenizer or GPU are touched, so model.path
may name a directory this machine lacks, and a sweep's eval.path a file it lacks)."""
from __future__ import annotations

import contextlib
import inspect
import io

from qcls.config.compose import compose
from qcls.config.overrides import split_args

# what each command with its own parser takes besides overrides: (how many arguments, what they are)
POSITIONALS = {"calibrate": (0, "no argument"), "label-next": (1, "one pool (a log folder or a query file)"),
               "audit": (1, "one labelled file")}


def _parse(parser, argv: list[str], known: bool):
    """argparse's result, or a ValueError with its message (argparse exits instead of raising); positionals may
    stand among the options, as `qcls audit` and `qcls label-next` parse them."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return parser.parse_known_args(argv) if known else (parser.parse_intermixed_args(argv), [])
    except SystemExit as e:
        if e.code == 0:  # --help / --version
            return None
        raise ValueError(err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else str(e)) from None


def _compose(overrides: list[str], args) -> object:
    """compose(overrides), with the command's config folder when the CLI has one (--config-dir)."""
    kw = {}
    config_dir = getattr(args, "config_dir", None)
    if config_dir is not None and "config_dir" in inspect.signature(compose).parameters:
        kw["config_dir"] = config_dir
    return compose(overrides, **kw)


def check_qcls(argv: list[str]) -> None:
    """Raise (ConfigError, ValueError) if `qcls argv…` would be refused for its options or overrides. The
    command's `--config-dir` folders (relative to the current directory) are in force while it is checked, as
    the CLI puts them: through QCLS_CONFIG_DIR."""
    import os

    from qcls.cli import commands as cli
    from qcls.config.paths import ENV_CONFIG_DIR
    dirs, argv = cli.take_config_dirs(list(argv))
    if not dirs:
        return _check(argv)
    saved = os.environ.get(ENV_CONFIG_DIR)
    try:
        from qcls.config.compose import export_user_config
        export_user_config(dirs, [])
        return _check(argv)
    finally:
        os.environ.pop(ENV_CONFIG_DIR, None)
        if saved is not None:
            os.environ[ENV_CONFIG_DIR] = saved


def _check(argv: list[str]) -> None:
    from qcls.cli import commands as cli
    literal = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = [a for a in (argv[:argv.index("--")] if "--" in argv else argv) if a != "--debug"]
    if not argv or argv[0] in ("-h", "--help", "--version"):
        return
    if argv[0] == "sweep":
        from qcls.sweep.sweep import preflight
        if "--report" in argv[1:] or "-h" in argv or "--help" in argv:
            return
        preflight(argv[1:], files=False)  # (the user's data files are not here, as model.path's directory is not)
        return
    if argv[0] in cli.ROUTED:  # a command with its own parser: its options, then its overrides
        import importlib
        parsed = _parse(importlib.import_module(cli.ROUTED[argv[0]]).build_parser(), argv[1:], known=False)
        if parsed is None:
            return
        args = parsed[0]
        stray, overrides = split_args(args.items)
        count, what = POSITIONALS.get(argv[0], (len(stray), ""))
        if len(stray) != count:
            raise ValueError(f"qcls {argv[0]} takes {what} besides key=value overrides, not {stray}")
        _compose(overrides, args)
        return
    parsed = _parse(cli.build_parser(), argv, known=True)
    if parsed is None:
        return
    args, rest = parsed
    bad = [r for r in rest if r.startswith("-")]
    if bad:
        raise ValueError(f"unrecognized arguments: {bad}")
    queries, overrides = split_args(list(args.items) + rest, literal)
    if args.cmd == "classify" and not queries:
        raise ValueError("qcls classify: give at least one query")
    if args.cmd in ("repl", "serve", "check") and queries:
        raise ValueError(f"qcls {args.cmd} takes overrides only (key=value), not {queries}")
    cfg = _compose(overrides, args)
    if args.cmd == "serve":  # the deployment options Serve would get (autoscaling checked against Ray's schema)
        from qcls.deployments.app import deployment_options
        deployment_options(cfg)
