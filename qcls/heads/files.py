"""The head file: one YAML that the `calibration=FILE` option loads, plus, for learned heads, its weights in a
safetensors file beside it (named by the YAML's `weights` key).

    method: head                      # or temperature_bias | temperature | bias | contextual
    weights: my_head.safetensors      # learned heads only; relative to the YAML
    meta: {model: …, fingerprint: {config: …, weights: …}, hidden_size: …, num_layers: …, strategy: …, …}
    prompts:
      category:                       # a temperature/bias calibration: (score + bias) / temperature
        temperature: 1.3
        bias: {dress: 0.2, jeans: -0.1, …}
      audience:                       # a learned head: tensors audience.bias [L], audience.features [L, F],
        labels: [boy, girl, …]        #   audience.scores [L, L] (when it reads the raw scores)
        read: {layer: 10, kind: both} # final | N; position | query_mean | both
        scores: true
        template_sha256: …            # the prompt it was fitted under
        info: {cv_accuracy: …, C: …, n: …}
        threshold: {min_prob: 0.62, fallback: none, fitted: {…}}   # optional, any prompt: below it the
                                      #   prompt abstains (qcls/heads/thresholds.py; older files have none)

Unknown keys are refused (a typo is an error) and every weight must be finite.
"""
from __future__ import annotations

import datetime as dt
import hashlib
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError

from qcls.errors import ConfigError
from qcls.heads.head import FINAL, Head, PromptHead, Read
from qcls.heads.thresholds import ThresholdEntry, threshold_of

METHODS = ("temperature_bias", "temperature", "bias", "contextual", "head")
FIT_METHODS = ("temperature_bias", "temperature", "bias")  # fitted on raw scores: qcls/fitting/calibration.py
HEADER = ("# qcls head: per prompt, head logits = W_s · scores + W_f · read state + c (a temperature/bias\n"
          "# calibration is (score + bias) / temperature); probabilities are their softmax over the prompt's\n"
          "# labels. Load it with the override calibration=<this file>.\n")


class CalibrationError(ConfigError):
    """A head or calibration file that cannot be used; the message names the file and the reason."""


EXPECTED = ("calibration= takes the YAML file that `qcls calibrate` writes (keys method, meta, prompts; a learned "
            "head's weights sit beside it in a .safetensors file of the same name)")
HOW_TO_GET = ("fit one with `qcls calibrate --method head --out FILE.yaml` (or --method temperature_bias), pass "
              "calibration=model for the model's own head, or calibration=null for the LLM's own label scores")
SAFETENSORS_MAGIC = b'{"'  # after the 8-byte header length: a safetensors header is a JSON object


def template_sha256(template: str, label_prefix: str) -> str:
    """What a learned head is tied to besides its labels: the text around {query} and the label prefix."""
    return hashlib.sha256(f"{template}\x00{label_prefix}".encode()).hexdigest()[:16]


class _TemperatureBias(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    temperature: float = Field(gt=0)
    bias: dict[str, float] = Field(min_length=2)
    threshold: ThresholdEntry | None = None


class _Read(BaseModel):
    model_config = ConfigDict(extra="forbid")
    layer: int | Literal["final"] = FINAL
    kind: Literal["position", "query_mean", "both"] = "position"


class _Learned(BaseModel):
    model_config = ConfigDict(extra="forbid")
    labels: list[str] = Field(min_length=2)
    tensors: str | None = None  # the prefix of its weights in the safetensors file (default: the prompt's name)
    read: _Read | None = None
    scores: bool = False
    template_sha256: str | None = None
    info: dict[str, Any] = Field(default_factory=dict)
    threshold: ThresholdEntry | None = None


def _entry_kind(v: Any) -> str:
    """A prompt entry with `temperature` or `bias` is a calibration, anything else a learned head: the errors
    then speak of the form the user wrote, not of both."""
    return "calibration" if isinstance(v, dict) and ("temperature" in v or "bias" in v) else "head"


_Entry = Annotated[Union[Annotated[_TemperatureBias, Tag("calibration")], Annotated[_Learned, Tag("head")]],
                   Discriminator(_entry_kind)]


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")
    method: Literal["temperature_bias", "temperature", "bias", "contextual", "head"]
    weights: str | None = None
    meta: dict[str, Any] = Field(default_factory=dict)
    prompts: dict[str, _Entry] = Field(min_length=1)
    # more heads of a prompt, fitted under other templates (qcls calibrate --append); learned heads only
    variants: dict[str, list[_Learned]] = Field(default_factory=dict)


def save(head: Head, path) -> None:
    """Write the YAML (and the safetensors file beside it when a prompt has learned weights)."""
    from safetensors.numpy import save_file
    path = Path(path)
    body: dict[str, Any] = {"method": head.method}
    tensors: dict[str, np.ndarray] = {}
    prompts: dict[str, Any] = {}
    for name, ph in head.prompts.items():
        if ph.is_temperature_bias:
            t = ph.temperature
            prompts[name] = {"temperature": t, "bias": {lab: float(b * t) for lab, b in zip(ph.labels, ph.bias)}}
            if ph.threshold is not None:
                prompts[name]["threshold"] = _plain(ph.threshold.as_dict())
        else:
            prompts[name] = _entry(ph, name, tensors)
    variants = {name: [_entry(ph, f"{name}@{i + 1}", tensors) for i, ph in enumerate(phs)]
                for name, phs in head.variants.items() if phs}
    if tensors:
        body["weights"] = path.with_suffix(".safetensors").name
        save_file(tensors, str(path.with_suffix(".safetensors")))
    body["meta"] = _plain(head.meta)
    body["prompts"] = prompts
    if variants:
        body["variants"] = variants
    text = HEADER + yaml.safe_dump(body, sort_keys=False, allow_unicode=True, default_flow_style=None, width=120)
    path.write_text(text, encoding="utf-8")


def _entry(ph: PromptHead, prefix: str, tensors: dict[str, np.ndarray]) -> dict[str, Any]:
    entry: dict[str, Any] = {"labels": list(ph.labels), "scores": ph.score_weights is not None}
    if "@" in prefix:
        entry["tensors"] = prefix
    if ph.read is not None:
        entry["read"] = ph.read.as_dict()
        tensors[f"{prefix}.features"] = ph.feature_weights.astype(np.float32)
    if ph.score_weights is not None:
        tensors[f"{prefix}.scores"] = ph.score_weights.astype(np.float32)
    tensors[f"{prefix}.bias"] = ph.bias.astype(np.float32)
    if ph.info.get("template_sha256"):
        entry["template_sha256"] = ph.info["template_sha256"]
    entry["info"] = _plain({k: v for k, v in ph.info.items() if k != "template_sha256"})
    if ph.threshold is not None:
        entry["threshold"] = _plain(ph.threshold.as_dict())
    return entry


def load(path) -> Head:
    path = Path(path)
    data = _read_yaml(path)
    try:
        f = _File.model_validate(data)
    except ValidationError as e:
        raise CalibrationError(f"calibration file {path}: {_why(e)}") from None
    learned = f.variants or any(isinstance(p, _Learned) for p in f.prompts.values())
    tensors = _weights(path, f) if learned else {}
    prompts = {}
    for name, p in f.prompts.items():
        if isinstance(p, _TemperatureBias):
            prompts[name] = PromptHead.temperature_bias(list(p.bias), p.temperature, list(p.bias.values()))
        else:
            prompts[name] = _learned(path, name, p, tensors)
        prompts[name].threshold = threshold_of(p.threshold, prompts[name].labels,
                                               f"calibration file {path}: prompt {name!r}")
    variants = {name: [_learned(path, name, p, tensors) for p in ps] for name, ps in f.variants.items()}
    for name, ps in f.variants.items():
        for p, ph in zip(ps, variants[name]):
            ph.threshold = threshold_of(p.threshold, ph.labels, f"calibration file {path}: prompt {name!r}")
    return Head(prompts, f.method, dict(f.meta), variants)


def _read_yaml(path: Path) -> dict:
    """The file's YAML mapping; anything else (the weights file, a binary, an empty file, a YAML of another
    kind) is refused naming the file, what it is, what was expected and how to get one."""
    where = f"calibration file {path}"
    try:
        raw = path.read_bytes()
    except IsADirectoryError:
        raise CalibrationError(f"{where} is a directory; {EXPECTED}", HOW_TO_GET) from None
    except OSError as e:
        raise CalibrationError(f"{where} cannot be read ({e.strerror or e})", HOW_TO_GET) from None
    if path.suffix == ".safetensors" or _is_safetensors(raw):
        yaml_twin = path.with_suffix(".yaml")
        hint = f"pass the YAML beside it: calibration={yaml_twin}" if yaml_twin.is_file() else HOW_TO_GET
        raise CalibrationError(f"{where} is a head's weights (safetensors), not its head file; {EXPECTED}", hint)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CalibrationError(f"{where} is a binary file, not YAML text; {EXPECTED}", HOW_TO_GET) from None
    if not text.strip():
        raise CalibrationError(f"{where} is empty; {EXPECTED}", HOW_TO_GET)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise CalibrationError(f"{where} is not valid YAML ({e}); {EXPECTED}", HOW_TO_GET) from None
    if isinstance(data, dict) and "method" in data:
        return data
    raise CalibrationError(f"{where} is not a head file: {_kind(data)}; {EXPECTED}", HOW_TO_GET)


def _is_safetensors(raw: bytes) -> bool:
    """A little-endian header length that fits the file, then a JSON object: the safetensors layout."""
    return len(raw) > 10 and raw[8:10] == SAFETENSORS_MAGIC and int.from_bytes(raw[:8], "little") < len(raw)


def _kind(data: Any) -> str:
    """What a YAML that is not a head file looks like, for the refusal."""
    if not isinstance(data, dict):
        return f"it holds a {type(data).__name__}, not a mapping"
    keys = sorted(map(str, data))[:8]
    if isinstance(data.get("prompts"), list):
        return f"it looks like a prompt set (a `prompts` list; keys {keys}), which goes in prompts=..."
    if "defaults" in data or "model" in data:
        return f"it looks like a qcls/Hydra config (keys {keys})"
    return f"it has keys {keys} and no `method`"


def _weights(path: Path, f: _File) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file
    if not f.weights:
        raise CalibrationError(f"calibration file {path}: learned heads need the `weights` key naming their "
                               "safetensors file")
    wpath = path.parent / f.weights
    try:
        return load_file(str(wpath))
    except (OSError, FileNotFoundError) as e:
        raise CalibrationError(f"calibration file {path}: its weights {wpath} cannot be read ({e}): keep the "
                               ".safetensors file beside the YAML") from None
    except Exception as e:  # safetensors raises its own error type for a damaged file
        raise CalibrationError(f"calibration file {path}: its weights {wpath} are not a safetensors file ({e})") \
            from None


def _learned(path: Path, name: str, p: _Learned, tensors: dict[str, np.ndarray]) -> PromptHead:
    where, n = f"calibration file {path}: prompt {name!r}", len(p.labels)
    if len(set(p.labels)) != n:
        raise CalibrationError(f"{where}: duplicate labels in {p.labels}")
    prefix = p.tensors or name

    def get(key: str, shape) -> np.ndarray | None:
        t = tensors.get(f"{prefix}.{key}")
        if t is None:
            return None
        if t.ndim != len(shape) or any(s is not None and s != d for s, d in zip(shape, t.shape)):
            raise CalibrationError(f"{where}: weights '{prefix}.{key}' have shape {list(t.shape)}, want "
                                   f"{[s if s is not None else 'F' for s in shape]}")
        if not np.isfinite(t).all():
            raise CalibrationError(f"{where}: weights '{prefix}.{key}' are not all finite (NaN or infinity): refit "
                                   "the head")
        return t.astype(np.float64)
    bias = get("bias", (n,))
    if bias is None:
        raise CalibrationError(f"{where}: the weights file has no '{prefix}.bias'")
    scores = get("scores", (n, n)) if p.scores else None
    if p.scores and scores is None:
        raise CalibrationError(f"{where}: scores: true but the weights file has no '{prefix}.scores'")
    features = get("features", (n, None)) if p.read else None
    if p.read and features is None:
        raise CalibrationError(f"{where}: a read is given but the weights file has no '{prefix}.features'")
    if scores is None and features is None:
        raise CalibrationError(f"{where}: a head that reads neither the scores nor a hidden state")
    try:
        read = Read(p.read.layer, p.read.kind) if p.read else None
    except ValueError as e:
        raise CalibrationError(f"{where}: {e}") from None
    info = dict(p.info)
    if p.template_sha256:
        info["template_sha256"] = p.template_sha256
    return PromptHead(list(p.labels), bias, scores, features, read, info)


def _why(e: ValidationError) -> str:
    out = []
    for err in e.errors():
        loc = [str(x) for x in err["loc"]]
        if loc[:1] == ["prompts"]:  # drop the union tag that the discriminator adds after the prompt's name
            loc = loc[:2] + [x for x in loc[2:3] if x not in ("calibration", "head")] + loc[3:]
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
    if isinstance(x, np.ndarray):
        return _plain(x.tolist())
    return x.item() if isinstance(x, np.generic) else x


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
