"""Start-up checks of the `calibration=FILE` option: the file against the config (before anything loads), then
a learned head against the model (its config before the weights are read, its weights once they are).

Every mismatch that would make the head's numbers meaningless is refused with a CalibrationError (exit 2 in
the CLI) naming what differs and the way out; harmless differences are notes that go into the results'
metadata."""
from __future__ import annotations

from pathlib import Path

from qcls.heads import fingerprint as fp
from qcls.heads.files import CalibrationError, load, template_sha256
from qcls.heads.head import FINAL, Head, PromptHead

REFIT = ("refit it with `qcls calibrate --method head` under this config, or run without it: calibration=null "
         "(a model config's default head is model.head)")


def resolve_path(value: str) -> Path:
    """Absolute, or relative to the current directory, then to the package (the shipped heads: qcls/paths.py)."""
    from qcls.paths import candidates, find_file
    found = find_file(value)
    if found is not None:
        return found
    tried = candidates(value)
    raise CalibrationError(f"calibration file {value!r} not found (looked at {', '.join(map(str, tried))}): "
                           "give an existing path, or calibration=null")


def head_for(cfg) -> tuple[Head | None, str | None, list[str]]:
    """The config's head file checked against its prompts: (head in the config's label order, its path,
    notes). Refused: scores of another strategy, prompts the config lacks, another label set, another
    template. Nothing about the model is known yet: see check_model_config / check_model_weights."""
    if cfg.calibration is None:
        return None, None, []
    path = resolve_path(cfg.calibration)
    head = load(path)
    where, notes = f"calibration file {path}", []
    fitted = head.meta.get("strategy")
    if head.reads_scores:  # scores of different strategies are on different scales
        if fitted is None:
            notes.append(f"{where} does not say which scoring strategy it was fitted under (meta.strategy)")
        elif fitted != cfg.strategy:
            raise CalibrationError(f"{where} was fitted under scoring={fitted}, but this config scores with "
                                   f"scoring={cfg.strategy}; scores of different strategies are on different "
                                   f"scales: add the override scoring={fitted}, or refit under scoring={cfg.strategy}")
    if head.meta.get("model") not in (None, cfg.model.name):
        notes.append(f"{where} was fitted on model {head.meta['model']}, this is {cfg.model.name}")
    specs = {p.name: p for p in cfg.prompts}
    extra = [n for n in head.prompts if n not in specs]
    if extra:
        raise CalibrationError(f"{where} has heads for prompts {extra} that the config lacks (its prompts: "
                               f"{list(specs)}): use a file fitted for these prompts, or remove those entries")
    out = {}
    for name in head.prompts:
        spec = specs[name]
        ph = _pick(head, spec, where)
        want = list(spec.labels)
        if set(ph.labels) != set(want) or len(ph.labels) != len(want):
            raise CalibrationError(
                f"{where}: prompt {name!r} has labels {ph.labels}, the config has {want} (missing from the "
                f"file: {[x for x in want if x not in ph.labels]}, not in the config: "
                f"{[x for x in ph.labels if x not in want]}): refit for this label set")
        out[name] = ph.reorder(want)
    missing = [n for n in specs if n not in head.prompts]
    if missing:
        notes.append(f"{where} has no entry for prompts {missing}: their probabilities are the raw scores' softmax")
    return Head(out, head.method, head.meta), str(path), notes


def _pick(head: Head, spec, where: str) -> PromptHead:
    """The head of a prompt fitted under the config's template (a calibration, which records none, fits any)."""
    sha = template_sha256(spec.template, spec.label_prefix)
    cands = head.candidates(spec.name)
    fits = [ph for ph in cands if ph.info.get("template_sha256") in (None, sha)]
    if not fits:
        shown = ", ".join(str(ph.info.get("template_sha256")) for ph in cands)
        raise CalibrationError(f"{where}: the head(s) of prompt {spec.name!r} were fitted under another template or "
                               f"label_prefix than the config's (template hash {sha}; the file's: {shown}): "
                               f"their hidden states mean something else here; {REFIT}, or add one to the file "
                               "with --append")
    return fits[0]


def check_model_config(head: Head | None, path: str | None, config) -> None:
    """Before the weights are read: a head that reads hidden states must fit this model's architecture."""
    if head is None or not head.reads_states:
        return
    where, meta = f"calibration file {path}", head.meta
    hidden, layers = fp.hidden_size(config), fp.num_layers(config)
    if meta.get("hidden_size") not in (None, hidden):
        raise CalibrationError(f"{where} was fitted on hidden states of size {meta['hidden_size']}, this model's "
                               f"are {hidden} ({fp.text_config(config).model_type}): {REFIT}")
    for name, ph in head.prompts.items():
        if ph.read is None:
            continue
        if ph.read.layer != FINAL and ph.read.layer >= layers:
            raise CalibrationError(f"{where}: prompt {name!r} reads layer {ph.read.layer}, this model has "
                                   f"{layers} layers (a head reads layer 1…{layers - 1} or final): {REFIT}")
        width = ph.feature_weights.shape[1]
        if width != hidden * len(ph.read.taps):
            raise CalibrationError(f"{where}: prompt {name!r} has {width} feature weights per label, a "
                                   f"{ph.read.kind} read of this model gives {hidden * len(ph.read.taps)}: {REFIT}")
    want = (meta.get("fingerprint") or {}).get("config")
    if want is not None and want != fp.config_fingerprint(config):
        raise CalibrationError(f"{where} was fitted on another architecture ({_facts(meta)}; this model: "
                               f"{fp.config_facts(config)}): {REFIT}")


def check_model_weights(head: Head | None, path: str | None, model) -> None:
    """Once the weights are loaded: a head that reads hidden states must have been fitted on these weights."""
    if head is None or not head.reads_states:
        return
    want = (head.meta.get("fingerprint") or {}).get("weights")
    if want is None:
        raise CalibrationError(f"calibration file {path} reads hidden states but does not say which weights it "
                               f"was fitted on (meta.fingerprint.weights): {REFIT}")
    got = fp.weights_fingerprint(model)
    if got != want:
        raise CalibrationError(f"calibration file {path} was fitted on other weights (model "
                               f"{head.meta.get('model')!r}, weights fingerprint {want}; these weights: {got}): "
                               f"a head's numbers hold only for the weights it was fitted on; {REFIT}")


def _facts(meta: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in (meta.get("config") or {}).items()) or "config facts not recorded"


def prompt_heads(head: Head | None, names: list[str]) -> list[PromptHead | None]:
    """Per prompt in the engine's order: its head, or None (raw scores)."""
    return [None if head is None else head.prompts.get(n) for n in names]
