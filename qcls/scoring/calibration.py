"""Per-prompt calibration tables (design.md §9): calibrated score = (score + bias[label]) / temperature.

The request path's half: the YAML file's schema, load/save, and `calibration_for`, which checks a file
against the config at start-up; the engine's tail then applies it inside its fixed kernels. Fitting the
tables on gold labels is evaluation work: qcls/eval/calibration.py.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

METHODS = ("temperature_bias", "temperature", "bias", "contextual")
FIT_METHODS = METHODS[:3]
HEADER = ("# qcls calibration: per prompt, calibrated score = (score + bias[label]) / temperature;\n"
          "# probabilities are the softmax of calibrated scores over the prompt's labels.\n"
          "# Load it with the override calibration=<this file>.\n")


class CalibrationError(ValueError):
    """A calibration file that cannot be used; the message names the file and the reason."""


@dataclass
class PromptCalibration:
    labels: list[str]
    temperature: float
    bias: list[float]  # in `labels` order

    def apply(self, scores: Sequence[float]) -> list[float]:
        return [(s + b) / self.temperature for s, b in zip(scores, self.bias, strict=True)]


@dataclass
class Calibration:
    prompts: dict[str, PromptCalibration]
    method: str
    meta: dict[str, Any] = field(default_factory=dict)

    def apply(self, prompt: str, scores: Sequence[float]) -> list[float]:
        """Calibrated scores of one prompt (in its label order); the identity for a prompt not calibrated."""
        pc = self.prompts.get(prompt)
        return [float(s) for s in scores] if pc is None else pc.apply(scores)

    def affine(self, prompt: str, n_labels: int) -> tuple[float, list[float]]:
        """(temperature, bias) of a prompt for the engine's tables; (1, 0) for a prompt not calibrated."""
        pc = self.prompts.get(prompt)
        return (1.0, [0.0] * n_labels) if pc is None else (pc.temperature, list(pc.bias))

    def save(self, path) -> None:
        body = {"method": self.method, "meta": _plain(self.meta),
                "prompts": {name: {"temperature": float(pc.temperature),
                                   "bias": {lab: float(b) for lab, b in zip(pc.labels, pc.bias)}}
                            for name, pc in self.prompts.items()}}
        text = HEADER + yaml.safe_dump(body, sort_keys=False, allow_unicode=True, default_flow_style=False)
        Path(path).write_text(text, encoding="utf-8")

    @classmethod
    def load(cls, path) -> "Calibration":
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as e:
            raise CalibrationError(f"calibration file {path}: cannot be read ({e.strerror or e})") from None
        except yaml.YAMLError as e:
            raise CalibrationError(f"calibration file {path}: not valid YAML ({e})") from None
        try:
            f = _File.model_validate(data)
        except ValidationError as e:
            raise CalibrationError(f"calibration file {path}: {_why(e)}") from None
        return cls({name: PromptCalibration(list(p.bias), p.temperature, list(p.bias.values()))
                    for name, p in f.prompts.items()}, f.method, dict(f.meta))


class _PromptFile(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    temperature: float = Field(gt=0)
    bias: dict[str, float] = Field(min_length=2)


class _File(BaseModel):
    """The file's schema; unknown keys are refused so a typo is an error."""
    model_config = ConfigDict(extra="forbid")
    method: Literal["temperature_bias", "temperature", "bias", "contextual"]
    meta: dict[str, Any] = Field(default_factory=dict)
    prompts: dict[str, _PromptFile] = Field(min_length=1)


def _why(e: ValidationError) -> str:
    out = []
    for err in e.errors():
        loc = [str(x) for x in err["loc"]]
        if loc[-1:] == ["[key]"]:  # YAML turned an unquoted label (yes, no, null, 1 …) into a non-string
            out.append(f"{'.'.join(loc[:-2])}: label {err['input']!r} is not a string (quote label names that "
                       "YAML reads as booleans, numbers or null)")
        else:
            out.append(f"{'.'.join(loc) or 'top level'}: {err['msg']}")
    return "; ".join(out)


def _plain(x):
    """numpy scalars and tuples → plain YAML types."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x.item() if isinstance(x, np.generic) else x


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


# ---- start-up ----------------------------------------------------------------------------------------
def resolve_path(value: str) -> Path:
    """Absolute, or relative to the current directory, then to the repository root."""
    from qcls.compose import conf_dir
    p = Path(value).expanduser()
    tried = [p] if p.is_absolute() else [Path.cwd() / p, conf_dir().parent / p]
    for cand in tried:
        if cand.is_file():
            return cand.resolve()
    raise CalibrationError(f"calibration file {value!r} not found (looked at {', '.join(map(str, tried))}): "
                           "give an existing path, or calibration=null")


def calibration_for(cfg) -> tuple[Calibration | None, str | None, list[str]]:
    """The config's calibration checked against its prompts: (calibration in the config's label order, its
    path, notes). Refused: another strategy, prompts the config lacks, a different label set."""
    if cfg.calibration is None:
        return None, None, []
    path = resolve_path(cfg.calibration)
    cal = Calibration.load(path)
    where, notes = f"calibration file {path}", []
    fitted = cal.meta.get("strategy")
    if fitted is None:
        notes.append(f"{where} does not say which scoring strategy it was fitted under (meta.strategy)")
    elif fitted != cfg.strategy:
        raise CalibrationError(f"{where} was fitted under scoring={fitted}, but this config scores with "
                               f"scoring={cfg.strategy}; scores of different strategies are on different scales: "
                               f"add the override scoring={fitted}, or refit under scoring={cfg.strategy}")
    if cal.meta.get("model") not in (None, cfg.model.name):
        notes.append(f"{where} was fitted on model {cal.meta['model']}, this is {cfg.model.name}")
    specs = {p.name: p for p in cfg.prompts}
    extra = [n for n in cal.prompts if n not in specs]
    if extra:
        raise CalibrationError(f"{where} calibrates prompts {extra} that the config lacks (its prompts: "
                               f"{list(specs)}): use a file fitted for these prompts, or remove those entries")
    out = {}
    for name, pc in cal.prompts.items():
        want = specs[name].labels
        if set(pc.labels) != set(want) or len(pc.labels) != len(want):
            raise CalibrationError(
                f"{where}: prompt {name!r} has labels {pc.labels}, the config has {want} (missing from the "
                f"file: {[x for x in want if x not in pc.labels]}, not in the config: "
                f"{[x for x in pc.labels if x not in want]}): refit the calibration for this label set")
        bias = dict(zip(pc.labels, pc.bias))
        out[name] = PromptCalibration(list(want), pc.temperature, [bias[x] for x in want])
    missing = [n for n in specs if n not in cal.prompts]
    if missing:
        notes.append(f"{where} has no entry for prompts {missing}: their calibrated scores equal the raw ones")
    return Calibration(out, cal.method, cal.meta), str(path), notes
