"""Start-up checks of the `calibration=FILE` option: the file against the config (before anything loads), then
a learned head against the model (its config before the weights are read, its weights once they are).

Every mismatch that would make the head's numbers meaningless is refused with a CalibrationError (exit 2 in
the CLI) naming what differs and the way out; harmless differences are notes that go into the results'
metadata."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from qcls.heads import weights_fingerprint as fp
from qcls.heads.files import EXPECTED, HOW_TO_GET, CalibrationError, load, template_sha256
from qcls.heads.head import FINAL, Head, PromptHead

REFIT = ("refit it with `qcls calibrate --method head` under this config, or run without it: calibration=null "
         "(calibration=model uses the model's own head file, model.head, for the prompts it was fitted for)")
# why a prompt of the model's default head file answers on the LLM's own label scores
NO_ENTRY = "no head in the file"
OTHER_TEMPLATE = "its head was fitted under another template"
OTHER_LABELS = "its head was fitted for another label set"
OTHER_SCORING = "its head reads scores of scoring="
HEAD, LLM = "head", "LLM scores"  # what answers a prompt, as the start-up line, `qcls classify` and the page say


def resolve_path(value: str) -> Path:
    """Absolute, or relative to the current directory, then to the package (the shipped heads: qcls/config/paths.py)."""
    from qcls.config.paths import candidates
    tried = candidates(value)
    for cand in tried:
        if cand.is_file():
            return cand.resolve()
        if cand.is_dir():
            yamls = sorted(x.name for x in cand.glob("*.yaml"))[:5]
            raise CalibrationError(f"calibration={value!r}: {cand} is a directory, not a file; {EXPECTED}"
                                   + (f" (YAML files in it: {yamls})" if yamls else ""), HOW_TO_GET)
    raise CalibrationError(f"calibration={value!r}: no such file (looked at {', '.join(map(str, tried))}); "
                           f"{EXPECTED}", HOW_TO_GET)


@dataclass
class HeadChoice:
    """What start-up serves each prompt with: `head` holds, in the config's label order, the heads that apply
    (None when none does); `own` names the prompts on the LLM's own label scores and why. `default`: the file is
    the model's own (calibration=model), used only where it fits; a file the user named must fit every prompt
    it has a head for."""
    head: Head | None
    path: str | None
    notes: list[str]
    default: bool = False
    own: dict[str, str] = field(default_factory=dict)
    file: str | None = None  # the file asked for, even when no prompt uses it
    names: list[str] = field(default_factory=list)  # the config's prompts, in order

    def drop(self, why: str) -> None:
        """The model's default head does not fit this model's weights or architecture: no prompt uses it."""
        for name in (self.head.prompts if self.head else {}):
            self.own[name] = why
        self.head, self.path = None, None

    def with_head(self) -> list[str]:
        return list(self.head.prompts) if self.head else []

    def line(self) -> str:
        """One line: per prompt whether a head answers it or the LLM's own label scores, and why (start-up,
        qcls check)."""
        if self.file is None:
            why = next(iter(self.own.values()), "calibration=null")
            return f"answers per prompt: {', '.join(f'{n}: {LLM}' for n in self.names)} (no head: {why})"
        what = f"the model's default head {self.file}" if self.default else f"head file {self.file}"
        each = [f"{n}: {HEAD}" if n not in self.own else f"{n}: {LLM} ({self.own[n]})" for n in self.names]
        return f"answers per prompt: {', '.join(each)}; {what}"

    def meta(self) -> dict:
        """For results' and metadata's `heads`: the file, whether it is the model's default, per prompt (`lost`:
        the prompts whose head in the file no longer fits them, and what to do: lost_head)."""
        lost = {n: note for n, why in self.own.items() if (note := lost_head(why)) is not None}
        return {"file": self.path or self.file, "default": self.default, "with_head": self.with_head(),
                "own_scores": dict(self.own), "lost": lost}


def lost_head(why: str) -> str | None:
    """What a prompt says beside its answer when the head file has a head of its name that no longer fits it (a
    label or its template edited, as the playground allows, or another scoring strategy): it answers on the LLM's
    own scores, and the way back. None for a prompt the file has no head for, or without a head file."""
    if why.startswith(OTHER_SCORING):
        fitted = why.removeprefix(OTHER_SCORING)
        return (f"no head for this prompt (its head reads scores of scoring={fitted}): {LLM}; refit with "
                f"qcls calibrate --method head, or add the override scoring={fitted}")
    if why not in (OTHER_LABELS, OTHER_TEMPLATE):
        return None
    back = "the labels" if why == OTHER_LABELS else "the template"
    return (f"no head for this prompt (its labels or template differ from the head's): {LLM}; refit with "
            f"qcls calibrate --method head, or restore {back}")


def head_for(cfg) -> tuple[Head | None, str | None, list[str]]:
    """(head, path, notes) of `choose`."""
    c = choose(cfg)
    return c.head, c.path, c.notes


def choose(cfg) -> HeadChoice:
    """The config's head file checked against its prompts. A file the user named is refused for scores of
    another strategy, prompts the config lacks, another label set or template; the model's default head
    (calibration=model) serves only the prompts it was fitted for. Nothing about the model is known yet: see
    check_model_config / check_model_weights."""
    c = _choose(cfg)
    c.names = [p.name for p in cfg.prompts]
    return c


def _choose(cfg) -> HeadChoice:
    file = cfg.calibration_file
    if file is None:
        why = "the model has no default head (model.head=null)" if cfg.calibration_is_default else "calibration=null"
        return HeadChoice(None, None, [], cfg.calibration_is_default, {p.name: why for p in cfg.prompts})
    if cfg.calibration_is_default:
        try:
            path = resolve_path(file)
            head = load(path)
        except CalibrationError as e:  # the model config's own file: say where it was named
            raise CalibrationError(f"model {cfg.model.name!r} names its default head model.head={file!r} "
                                   f"(calibration=model), which cannot be used: {e.what}",
                                   "give a head file with model.head=FILE or calibration=FILE, or run without a "
                                   "head: calibration=null") from None
        return _fitted_part(cfg, head, path, file)
    path = resolve_path(file)
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
    return HeadChoice(Head(out, head.method, head.meta), str(path), notes, False, {n: NO_ENTRY for n in missing},
                      file)


def _fitted_part(cfg, head: Head, path: Path, file: str) -> HeadChoice:
    """The model's default head on the prompts it was fitted for (same name, template and label set, and for a
    head on the scores the same strategy); every other prompt keeps the LLM's own label scores."""
    out, own = {}, {}
    for spec in cfg.prompts:
        ph, why = _fitted_for(head, spec, cfg.strategy)
        if ph is None:
            own[spec.name] = why
        else:
            out[spec.name] = ph.reorder(list(spec.labels))
    notes = []
    if head.meta.get("model") not in (None, cfg.model.name):
        notes.append(f"the model's default head {path} was fitted on model {head.meta['model']}, this is "
                     f"{cfg.model.name}")
    return HeadChoice(Head(out, head.method, head.meta) if out else None, str(path) if out else None, notes, True,
                      own, file)


def _fitted_for(head: Head, spec, strategy: str) -> tuple[PromptHead | None, str]:
    """The head entry fitted for this prompt, or None and why there is none."""
    cands = head.candidates(spec.name)
    if not cands:
        return None, NO_ENTRY
    sha = template_sha256(spec.template, spec.label_prefix)
    cands = [ph for ph in cands if ph.info.get("template_sha256") in (None, sha)]
    if not cands:
        return None, OTHER_TEMPLATE
    want = sorted(spec.labels)
    cands = [ph for ph in cands if sorted(ph.labels) == want]
    if not cands:
        return None, OTHER_LABELS
    fitted = head.meta.get("strategy")
    cands = [ph for ph in cands if ph.score_weights is None or fitted in (None, strategy)]
    if not cands:
        return None, f"{OTHER_SCORING}{fitted}"
    return cands[0], ""


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


def portable(cfg):
    """The config with head files found relative to this process's directory made absolute, for processes that
    run elsewhere (Serve replicas, Ray Data actors: a directory of Ray's choosing). A file found in the package
    (a shipped head) stays relative, so each process finds its own installed copy."""
    from qcls.config import MODEL_HEAD

    def pinned(value: str | None) -> str | None:
        if value is None or value == MODEL_HEAD or Path(value).is_absolute():
            return value
        here = Path.cwd() / Path(value).expanduser()
        return str(here.resolve()) if here.is_file() else value
    model = cfg.model.model_copy(update={"head": pinned(cfg.model.head)})
    return cfg.model_copy(update={"calibration": pinned(cfg.calibration), "model": model})
