"""The `eval` config group (conf/eval/*.yaml): which labelled file a sweep job scores, and how."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from omegaconf import DictConfig, OmegaConf
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from qcls.config.compose import ConfigError, validate
from qcls.config import QclsConfig
from qcls.eval.dataset import DatasetError
from qcls.heads.files import FIT_METHODS


class HeadSpec(BaseModel):
    """How a sweep job fits a learned head (eval.fit_method=head); every key is a sweep axis."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    layer: int | Literal["final", "auto"] = "auto"  # the residual stream after N layers, the final norm, or auto
    read: Literal["position", "query_mean", "both", "auto"] = "auto"
    # how `auto` chooses the depth for the prompt set (qcls/fitting/head_depth.py): one-se = the shallowest exit
    # within one standard error of every prompt's best; best = each prompt's most accurate read, whatever it costs
    layer_rule: Literal["one-se", "best"] = "one-se"
    max_layer: int | None = Field(default=None, ge=1)  # no read after this many layers (nor final unless ≥ N)
    scores: bool = False  # the raw label scores as features too
    cv_folds: int = Field(default=3, ge=2)  # the search's folds (read, L2 strength)
    nested_folds: int = Field(default=5, ge=2)  # the nested cross-validation's outer folds (qcls/fitting/nested.py)
    # the learning curve: held-out accuracy of heads fitted on this many fitting queries (and on all of them)
    curve_sizes: list[int] = Field(default_factory=lambda: [25, 50, 100])
    curve_draws: int = Field(default=5, ge=1)  # random subsets per size (the same for every job)


class EvalSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # JSONL, CSV or TSV file (qcls/eval/dataset.py): absolute, or relative to the current directory, then to the
    # repository root
    path: str = Field(min_length=1)
    limit: int | None = Field(default=None, ge=1)  # at most this many queries of each split (eval and fit_on)
    # a second split to fit calibration on inside the job (the "with calibration" columns); null = none
    fit_on: str | None = None
    fit_method: str = "temperature_bias"  # temperature_bias | temperature | bias | head (qcls/heads/files.py)
    head: HeadSpec = HeadSpec()  # with fit_method=head
    batch1_queries: int = Field(default=32, ge=0)  # queries also timed alone (batch 1)
    # winner agreement with scoring=exact; trie / first_token jobs need an extra exact pass for it
    agreement_with_exact: bool = True


def resolve_path(value: str, what: str = "eval.path") -> Path:
    """Absolute, or relative to the current directory, then to the package (shipped splits: qcls/config/paths.py)."""
    from qcls.config.paths import candidates, find_file
    found = find_file(value)
    if found is not None:
        return found
    tried = candidates(value)
    raise DatasetError(f"{what}={value!r}: no such file (looked at {', '.join(map(str, tried))}); give an "
                       f"existing JSONL, CSV or TSV file, e.g. {what}=/some/file.jsonl or {what}=/some/file.csv")


def split_config(cfg: DictConfig | dict[str, Any]) -> tuple[EvalSpec, QclsConfig]:
    """A composed sweep config → (its `eval` part, the Classifier's config). Both refuse unknown keys."""
    data = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    data = {k: v for k, v in data.items() if k != "hydra"}
    if "eval" not in data:
        raise ConfigError("the sweep config has no `eval` group: add eval=dev, eval=test or eval.path=FILE")
    raw = data.pop("eval")
    try:
        spec = EvalSpec.model_validate(raw)
    except ValidationError as e:
        lines = [f"  eval.{'.'.join(str(p) for p in err['loc']) or ''}: {err['msg']}" for err in e.errors()]
        raise ConfigError("invalid eval config:\n" + "\n".join(lines)) from None
    if spec.fit_method not in (*FIT_METHODS, "head"):
        raise ConfigError(f"eval.fit_method={spec.fit_method!r}: use one of {[*FIT_METHODS, 'head']}")
    return spec, validate(data)


def named_split(name: str) -> EvalSpec:
    """The eval group's option <name> (a user's config folder first, then qcls/conf/eval/) as an EvalSpec (for
    `qcls calibrate --eval dev`)."""
    from qcls.config.paths import group_options
    options = group_options("eval")
    f = options.get(name)
    if f is None:
        raise ConfigError(f"no eval split {name!r} (eval/{name}.yaml); known: {sorted(options)}, or give a path")
    return EvalSpec.model_validate(OmegaConf.to_container(OmegaConf.load(f), resolve=True))
