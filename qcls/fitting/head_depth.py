"""How deep the forward runs for a prompt set whose answers come from heads (docs/design.md §10): the forward
can stop after the deepest layer any prompt's head reads, so the reads are chosen for the set as a whole.

Each prompt brings its candidate reads, cross-validated on the fitting split (qcls/fitting/heads.py `cv_reads`).
An *exit* is a depth the forward stops at: after L decoder layers (cost L / N of the forward), or `final`
(all N layers and the final norm, cost 1.0). At an exit every prompt may use any of its reads at or below it,
and takes the one with the lowest cross-validated log-loss there. The rules:

- `one-se` (the default): the shallowest exit at which every prompt's log-loss is within one standard error
  (over the folds, of the prompt's own best read) of that prompt's best log-loss over all allowed exits;
- `best`: every prompt its lowest log-loss read whatever it costs (the exit is the deepest of them).

`max_layer` removes the reads after layer M (and `final`, unless M ≥ N) before either rule.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from qcls.errors import ConfigError
from qcls.heads.head import FINAL, Read

RULES = ("one-se", "best")


@dataclass(frozen=True)
class ReadCV:
    """One candidate read of one prompt, cross-validated at its best L2 strength C."""
    read: Read
    C: float
    log_loss: float  # mean held-out log-loss over the pooled folds
    se: float  # standard error of the per-fold mean log-losses: std (ddof 1) / √folds
    accuracy: float  # held-out accuracy of the pooled folds

    @classmethod
    def from_folds(cls, read: Read, C: float, log_loss: float, fold_log_loss: Sequence[float],
                   accuracy: float) -> "ReadCV":
        return cls(read, C, float(log_loss), standard_error(fold_log_loss), float(accuracy))

    @property
    def name(self) -> str:
        return f"{self.read.kind}@{self.read.layer}"


def standard_error(values: Sequence[float]) -> float:
    """std (ddof 1) / √k of k per-fold values; 0 for a single fold."""
    v = np.asarray(values, dtype=np.float64)
    return float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else 0.0


def depth(layer: int | str, num_layers: int) -> float:
    """Where a read sits in the forward, for ordering: L for the stream after L layers, `final` after all of
    them (the final norm runs last)."""
    return num_layers + 0.5 if layer == FINAL else float(layer)


def layers_run(layer: int | str, num_layers: int) -> int:
    return num_layers if layer == FINAL else int(layer)


def cost(layer: int | str, num_layers: int) -> float:
    """The share of the forward an exit at `layer` runs: layers run / N (`final`: 1.0)."""
    return layers_run(layer, num_layers) / num_layers


def most_accurate(tried: Sequence[ReadCV]) -> ReadCV:
    """The lowest cross-validated log-loss (the first in candidate order on a tie)."""
    return min(tried, key=lambda r: r.log_loss)


@dataclass
class DepthChoice:
    """The reads chosen for a prompt set and what its forward costs; `table` per candidate exit."""
    rule: str
    max_layer: int | None
    num_layers: int
    exit: int | str  # the deepest read chosen: a layer count or `final`
    reads: dict[str, ReadCV]  # per prompt the read chosen
    best_exit: int | str  # where `best` would have stopped
    table: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def cost(self) -> float:
        return cost(self.exit, self.num_layers)

    def as_meta(self) -> dict[str, Any]:
        """What the head file records in `meta.depth` (and `qcls calibrate --json` prints)."""
        return {"rule": self.rule, "max_layer": self.max_layer, "num_layers": self.num_layers,
                "exit_layer": self.exit, "layers_run": layers_run(self.exit, self.num_layers),
                "forward_cost": round(self.cost, 4),
                "most_accurate": {"exit_layer": self.best_exit,
                                  "forward_cost": round(cost(self.best_exit, self.num_layers), 4)},
                "candidates": self.table, **({"notes": self.notes} if self.notes else {})}


def choose(tried: dict[str, Sequence[ReadCV]], num_layers: int, rule: str = "one-se",
           max_layer: int | None = None, full_depth: str | None = None) -> DepthChoice:
    """The reads of a prompt set by `rule` (module docstring). `tried`: per prompt its candidate reads.
    `full_depth`: why the forward runs all N layers whatever the reads (heads that read the raw scores): then
    every exit costs the same and each prompt keeps its most accurate read."""
    if rule not in RULES:
        raise ConfigError(f"layer rule {rule!r}: use one of {list(RULES)}", "one-se: the shallowest exit within one "
                          "standard error of every prompt's best; best: the most accurate whatever it costs")
    allowed = {p: _allowed(p, rs, num_layers, max_layer) for p, rs in tried.items()}
    if not allowed:  # no prompt has a head: nothing to choose
        return DepthChoice(rule, max_layer, num_layers, FINAL, {}, FINAL)
    exits = sorted({r.read.layer for rs in allowed.values() for r in rs}, key=lambda e: depth(e, num_layers))
    best = {p: most_accurate(rs) for p, rs in allowed.items()}
    best_exit = max((b.read.layer for b in best.values()), key=lambda e: depth(e, num_layers), default=FINAL)
    table = [_row(e, allowed, best, num_layers) for e in exits]
    notes = []
    if rule == "best" or full_depth:
        chosen, exit_ = best, best_exit
        if full_depth and rule != "best":
            notes.append(f"{full_depth}: the forward runs all {num_layers} layers whatever the read, so every prompt "
                         "keeps its most accurate read (the one-SE rule has no cost to save)")
    else:
        exit_ = next((row["exit_layer"] for row in table if row["all_within_one_se"]), None)
        if exit_ is None:  # no finite log-loss to compare (a fold lacked a label: nested folds of a small split)
            exit_, chosen = best_exit, best
            notes.append("no exit has every prompt's log-loss finite and within one SE: the most accurate reads")
        else:
            chosen = {p: _best_at(rs, exit_, num_layers) for p, rs in allowed.items()}
    return DepthChoice(rule, max_layer, num_layers, exit_, chosen, best_exit, table, notes)


def within(reads: Sequence[Read], num_layers: int, max_layer: int | None) -> list[Read]:
    """The candidate reads a `max_layer` leaves (refused before the model loads when none is left)."""
    if max_layer is None:
        return list(reads)
    if max_layer < 1:
        raise ConfigError(f"max layer {max_layer}: give a layer count of at least 1", "e.g. --max-layer 12")
    kept = [r for r in reads if layers_run(r.layer, num_layers) <= max_layer
            and not (r.layer == FINAL and max_layer < num_layers)]
    if not kept:
        asked = ", ".join(sorted({str(r.layer) for r in reads}))
        raise ConfigError(f"max layer {max_layer}: the reads asked for (layer {asked}) all lie deeper",
                          f"give --layer auto, or a --layer of at most {max_layer}")
    return kept


def _allowed(prompt: str, reads: Sequence[ReadCV], num_layers: int, max_layer: int | None) -> list[ReadCV]:
    if max_layer is None:
        return list(reads)
    kept = [r for r in reads if layers_run(r.read.layer, num_layers) <= max_layer
            and not (r.read.layer == FINAL and max_layer < num_layers)]
    if not kept:
        shown = sorted({str(r.read.layer) for r in reads}, key=lambda s: depth(int(s) if s.isdigit() else s,
                                                                            num_layers))
        raise ConfigError(f"--max-layer {max_layer}: prompt {prompt!r} has no candidate read at or below layer "
                          f"{max_layer} (its candidates read layers {', '.join(shown)})",
                          f"raise --max-layer, or give --layer auto or a --layer of at most {max_layer}")
    return kept


def _best_at(reads: Sequence[ReadCV], exit_: int | str, num_layers: int) -> ReadCV | None:
    """A prompt's lowest-log-loss read among those the forward has computed by `exit_`."""
    here = [r for r in reads if depth(r.read.layer, num_layers) <= depth(exit_, num_layers)]
    return most_accurate(here) if here else None


def _row(exit_: int | str, allowed: dict[str, list[ReadCV]], best: dict[str, ReadCV], num_layers: int) -> dict:
    """One candidate exit: per prompt the read it would use there, its CV accuracy, log-loss and SE, and whether
    that log-loss is within one SE of the prompt's best."""
    prompts = {}
    for p, rs in allowed.items():
        r = _best_at(rs, exit_, num_layers)
        if r is None:
            prompts[p] = None
            continue
        prompts[p] = {"read": r.name, "cv_accuracy": round(r.accuracy, 4), "cv_log_loss": round(r.log_loss, 4),
                      "cv_log_loss_se": round(r.se, 4),
                      "within_one_se": bool(r.log_loss <= best[p].log_loss + best[p].se)}
    return {"exit_layer": exit_, "layers_run": layers_run(exit_, num_layers),
            "forward_cost": round(cost(exit_, num_layers), 4),
            "all_within_one_se": all(v is not None and v["within_one_se"] for v in prompts.values()),
            "prompts": prompts}


def forward_costs(reads: dict[str, int | str | None], num_layers: int) -> dict[str, Any]:
    """What a prompt set's forward costs with these heads: per prompt the layer its head reads (None: no head
    reading a state, or one reading the raw scores: all N layers) and the exit = the deepest of them."""
    per = {p: {"read_layer": lay, "layers_run": num_layers if lay is None else layers_run(lay, num_layers),
               "forward_cost": round(1.0 if lay is None else cost(lay, num_layers), 4)} for p, lay in reads.items()}
    run = max((v["layers_run"] for v in per.values()), default=num_layers)
    return {"num_layers": num_layers, "layers_run": run, "forward_cost": round(run / num_layers, 4),
            "per_prompt": per}


def table_lines(meta: dict[str, Any]) -> list[str]:
    """`meta.depth` as the table `qcls calibrate` prints: per candidate exit its layers and cost, and per prompt
    the read it would use there, CV accuracy and log-loss ± SE (`*`: within one SE of the prompt's best); the
    chosen exit marked `→`."""
    rows = meta.get("candidates") or []
    if not rows:
        return []
    n = meta["num_layers"]
    prompts = list(rows[-1]["prompts"])
    head = ["", "exit", "cost"] + [f"{p}: read, acc, log-loss ± SE" for p in prompts]
    body = []
    for r in rows:
        cells = ["→" if r["exit_layer"] == meta["exit_layer"] else "",
                 f"{r['exit_layer']} ({r['layers_run']}/{n})", f"{r['forward_cost']:.2f}"]
        for p in prompts:
            v = r["prompts"][p]
            cells.append("-" if v is None else f"{v['read']} {v['cv_accuracy']:.3f} {v['cv_log_loss']:.3f}±"
                                               f"{v['cv_log_loss_se']:.3f}{'*' if v['within_one_se'] else ''}")
        body.append(cells)
    widths = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
    best = meta["most_accurate"]
    lines = [f"depth (rule {meta['rule']}{'' if meta['max_layer'] is None else ', max layer ' + str(meta['max_layer'])}"
             f"): exit after {meta['layers_run']} of {n} layers = {meta['forward_cost']:.2f} of the forward; the most "
             f"accurate reads (rule best) exit at {best['exit_layer']} = {best['forward_cost']:.2f}. Per candidate "
             "exit, each prompt's best read at or below it (cross-validated on the split; * = within one standard "
             "error of the prompt's best):"]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(x, widths)).rstrip() for x in [head] + body]
    lines += [f"note: {x}" for x in meta.get("notes", [])]
    return lines
