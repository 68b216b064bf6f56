"""Start-up errors a user can act on, and the one way they are shown.

A `QclsError` says what failed (`what`) and what to do about it (`way_out`). Each subclass also derives from
the builtin exception that code caught before it existed (ValueError, FileNotFoundError, ImportError,
RuntimeError), so an `except ValueError` written earlier still sees a ConfigError. The CLI prints one
`qcls: error: …` paragraph and exits with status 2; the traceback only with `--debug` or QCLS_DEBUG=1.

Any other exception is a bug (in qcls or a library) rather than bad input: the CLI says so in one line and
exits with status 1, pointing at --debug, and never dresses it up as a user error.
"""
from __future__ import annotations

import os
import re
import sys
import traceback
from typing import Callable

USER_ERROR = 2  # exit status: the input (config, source, environment) cannot run; the message says why
INTERNAL_ERROR = 1  # exit status: an unexpected exception (a bug); --debug shows the traceback


class QclsError(Exception):
    """What failed and the way out; `str()` is both, so logs and Ray's error text carry the whole message."""

    def __init__(self, what: str, way_out: str | None = None):
        super().__init__(what)
        self.what = what
        self.way_out = way_out

    def __str__(self) -> str:
        return self.what if not self.way_out else f"{self.what}\n{self.way_out}"


class ConfigError(QclsError, ValueError):
    """A configuration that cannot run; the message names the field and the reason."""


class LabelSetError(QclsError, ValueError):
    """A prompt that cannot be scored: labels whose tokens collide, an unusable end token, no text around
    {query}."""


class ModelSourceError(QclsError, FileNotFoundError):
    """The model's weights, config or tokenizer are not where model.source / model.path say."""


class HubUnreachableError(ModelSourceError):
    """A hub id that is neither reachable nor in the local Hugging Face cache."""


class DeviceError(QclsError, RuntimeError):
    """The chosen device or backend cannot run on this machine (no CUDA GPU, a CPU-less kernel)."""


class MissingPackageError(QclsError, ImportError):
    """An optional dependency that the chosen command or backend needs is not installed."""


# Optional packages → the pyproject extra that installs them (pyproject.toml [project.optional-dependencies]).
EXTRAS = {"bitsandbytes": "bnb", "gptqmodel": "gptq", "optimum": "gptq", "ray": "serve", "fastapi": "serve",
          "matplotlib": "eval", "sklearn": "eval", "threadpoolctl": "eval", "hydra_plugins": "sweep",
          "pyarrow": "bulk", "pandas": "bulk"}


def missing_package(err: ImportError, purpose: str | None = None) -> MissingPackageError | None:
    """A MissingPackageError for an ImportError of a known optional package, else None (a real bug)."""
    top = (getattr(err, "name", None) or "").split(".")[0]
    if top not in EXTRAS:
        return None
    extra = EXTRAS[top]
    need = f"{purpose} needs" if purpose else "this needs"
    return MissingPackageError(f"{need} the optional package {top!r}, which is not installed",
                               f"install it with: pip install 'qcls[{extra}]'")


def from_remote(text: str) -> QclsError | None:
    """The QclsError inside another process's error text (a Ray Serve replica's failed start-up: Serve reports
    the constructor's traceback as a string), or None. str(QclsError) has no blank line, so the message runs
    from its class name to the first blank line or the end."""
    m = re.search(r"qcls\.errors\.(\w+): (.*?)(?:\n\s*\n|\Z)", text, re.S)
    if m is None:
        return None
    cls = globals().get(m.group(1))
    cls = cls if isinstance(cls, type) and issubclass(cls, QclsError) else QclsError
    what, _, way_out = m.group(2).strip().partition("\n")
    return cls(what, way_out or None)


def debug_wanted(flag: bool = False) -> bool:
    return flag or os.environ.get("QCLS_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


def format_error(err: BaseException, prog: str = "qcls") -> str:
    """One paragraph: `prog: error: what`, then the way out indented beneath it."""
    if isinstance(err, QclsError):
        what, way_out = err.what, err.way_out
    else:
        what, way_out = str(err) or type(err).__name__, None
    lines = [f"{prog}: error: {what.strip()}"]
    if way_out:
        lines += ["  " + line for line in way_out.strip().splitlines()]
    return "\n".join(lines)


def one_line(err: BaseException) -> str:
    """The error as one line (a refusal in a status or beside a field): a QclsError's what and way out; anything
    else (out of memory, a library's error) by its type."""
    return " ".join(str(err).split("\n")) if isinstance(err, QclsError) else f"{type(err).__name__}: {err}"


def as_user_error(err: BaseException) -> BaseException | None:
    """The error to show as bad input, or None for a bug. ValueError / OSError are how this codebase (and
    transformers) refuse input and files, so they count as user errors; an ImportError only for a known
    optional package."""
    if isinstance(err, QclsError):
        return err
    if isinstance(err, ImportError):
        return missing_package(err)
    if isinstance(err, (ValueError, OSError)):
        return err
    return None


def run_guarded(fn: Callable[[], int], debug: bool = False, prog: str = "qcls", out=None) -> int:
    """Run a command's start-up and work; turn its errors into one message and an exit status."""
    out = out or sys.stderr
    try:
        return fn()
    except KeyboardInterrupt:
        return 130
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001 - every exception gets a message; bugs are told apart below
        if debug_wanted(debug):
            traceback.print_exc(file=out)
        user = as_user_error(e)
        if user is not None:
            print(format_error(user, prog), file=out)
            return USER_ERROR
        print(f"{prog}: internal error: {type(e).__name__}: {e}\n  this is a bug (in qcls or a library), not "
              "your input: run again with --debug (or QCLS_DEBUG=1) for the traceback and report it", file=out)
        return INTERNAL_ERROR
