"""The learned head's command-line options and the fit they ask for, one set for `qcls calibrate --method head` and
`qcls audit` (which audits a labelled file with the out-of-fold probabilities of the very head calibrate fits)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from qcls.fitting.heads import FOLDS as H_FOLDS
from qcls.fitting.nested import NESTED_FOLDS
from qcls.heads.head import Head, Tap


def add(ap: argparse.ArgumentParser, title: str, nested_folds: int = NESTED_FOLDS) -> None:
    """The head options (--layer, --layer-rule, --max-layer, --read, --with-scores, --cv-folds, --nested-folds) as
    a group."""
    g = ap.add_argument_group(title)
    g.add_argument("--layer", default="auto", metavar="auto|final|N",
                   help="the layer read: the final norm's output, the residual stream after N layers, or auto "
                        "(default: ~15 layers and final tried, chosen by cross-validation and --layer-rule)")
    g.add_argument("--layer-rule", default="one-se", choices=["one-se", "best"],
                   help="with --layer auto: one-se (default) = the shallowest exit (the forward stops after the "
                        "deepest layer any prompt reads) at which every prompt's CV log-loss is within one standard "
                        "error of its own best; best = every prompt its lowest CV log-loss, whatever it costs")
    g.add_argument("--max-layer", type=int, metavar="N", help="no read after N layers (nor final, unless N is the "
                   "model's depth): a cap on the forward's cost")
    g.add_argument("--read", default="auto", choices=["position", "query_mean", "both", "auto"],
                   help="the read position, the mean over the query's tokens, both, or auto (default: chosen per "
                        "prompt by cross-validation)")
    g.add_argument("--with-scores", action="store_true", help="the raw label scores as features too")
    g.add_argument("--cv-folds", type=int, metavar="K", help="folds of the cross-validation that chooses the "
                   "read and L2 strength (default 3, or with --thresholds-for the file's; every label needs K "
                   "examples)")
    g.add_argument("--nested-folds", type=int, metavar="M", help="outer folds of the nested cross-validation that "
                   "judges the whole choice: the head's CV accuracy and the out-of-fold probabilities thresholds "
                   f"and audits read (default {nested_folds}, or with --thresholds-for the file's; "
                   "docs/evaluation.md)")
    ap.set_defaults(default_nested_folds=nested_folds)


def folds(args: argparse.Namespace) -> tuple[int, int]:
    """(--cv-folds, --nested-folds) as given, else their defaults; refused below 2."""
    got = (H_FOLDS if args.cv_folds is None else args.cv_folds,
           args.default_nested_folds if args.nested_folds is None else args.nested_folds)
    for flag, k in zip(("--cv-folds", "--nested-folds"), got):
        if k < 2:
            raise ValueError(f"{flag} {k}: cross-validation needs at least 2 folds; give {flag} 2 or more")
    return got


@dataclass
class FittedSplit:
    """A head fitted on a labelled split, with what it was fitted from (per prompt the states, raw scores and
    gold labels of the split's rows; the taps the states are)."""
    head: Head
    sets: dict  # prompt → qcls/fitting/head_fitting.py StateSet
    taps: list[Tap]
    notes: list[str]
    nested: Any = None  # qcls/fitting/nested.py Outcome: the fit's nested out-of-fold probabilities


def states_cfg(cfg) -> tuple[Any, list[str]]:
    """The configuration whose states a head is fitted on: the one given, but float32 where the default backend
    (auto) runs int8. Measured on the demo's test split, a head fitted on float32 states kept its accuracy within
    0.01 on int8 states, while heads fitted on int8 states lost up to 0.026 (docs/backends.md)."""
    from qcls.backends.registry import AUTO, resolved_name
    if cfg.backend.name != AUTO or resolved_name(cfg) != "int8":
        return cfg, []
    fp = cfg.backend.model_copy(update={"name": "fp16", "options": {}})
    return cfg.model_copy(update={"backend": fp}), [
        "backend auto: the head is fitted on float32 states (backend=fp16), which serve int8 ones as well; "
        "backend=int8 fits it on int8 states"]


def fit(args: argparse.Namespace, cfg, data) -> FittedSplit:
    """The head the options ask for, fitted on `data` (docs/design.md §10): a split it cannot be fitted on is
    refused before the model loads."""
    from qcls.backends import sources
    from qcls.classifier import Classifier
    from qcls.fitting import head_depth, head_fitting
    from qcls.fitting import heads as H
    from qcls.heads.weights_fingerprint import num_layers

    cv_folds, nested_folds = folds(args)
    notes = head_fitting.check_fit_split(data, cfg.prompts, cv_folds)
    if cfg.calibration not in (None, "model"):
        notes.append(f"calibration={cfg.calibration} is not read: the heads here are fitted on the file's own "
                     "states and raw scores")
    cfg, backend_notes = states_cfg(cfg.model_copy(update={"calibration": None}))  # raw states, not another head's
    notes += backend_notes
    layers = num_layers(sources.load_config(sources.resolve(cfg.model, cfg.cache_dir)))
    reads = head_depth.within(H.candidate_reads(args.layer, args.read, layers), layers, args.max_layer)
    taps = H.taps_of(reads)
    clf = Classifier(cfg, taps=taps)
    sets = head_fitting.read_set(clf, data)
    head, outcome = head_fitting.fit_nested(clf, sets, taps, reads, args.with_scores, cv_folds,
                                            str(data.path), rule=args.layer_rule, max_layer=args.max_layer,
                                            nested_folds=nested_folds)
    return FittedSplit(head, sets, taps, notes, outcome)
