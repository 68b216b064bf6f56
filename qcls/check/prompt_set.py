"""A new prompt set checked against a loaded Classifier before anything is built: each prompt's fields (the
config's own rules), distinct names, the label sets as start-up tokenizes them on the Classifier's tokenizer, the
whole configuration, and whether its head reads only layers the Classifier loaded. Every problem is kept beside its
prompt and field (the playground's PUT /v1/prompts shows each one next to what it is about)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from qcls.config import PromptSpec, QclsConfig
from qcls.errors import LabelSetError, QclsError, one_line

if TYPE_CHECKING:
    from qcls.classifier import Classifier


@dataclass(frozen=True)
class FieldProblem:
    prompt: int | None  # the prompt's position in the set (None: the whole set)
    field: str | None  # name, template, label_prefix, label_end or labels (None: the whole set)
    message: str


def validate_prompts(clf: "Classifier", raw: list[dict[str, Any]]) -> tuple[QclsConfig | None, list[FieldProblem]]:
    """The configuration serving these prompts instead, or every problem found, each beside its prompt and field."""
    from qcls.engine.layout import PromptLayout
    from qcls.scoring.strategies import get_strategy

    errors, specs = [], []
    for i, given in enumerate(raw):
        try:
            specs.append(PromptSpec.model_validate(given))
        except ValidationError as e:
            for err in e.errors(include_url=False):
                where = str(err["loc"][0]) if err["loc"] else None
                errors.append(FieldProblem(i, where, err["msg"].removeprefix("Value error, ")))
    names = [str(given.get("name")) if isinstance(given, dict) else None for given in raw]
    errors += [FieldProblem(i, "name", f"another prompt is named {n!r}: names must be distinct")
               for i, n in enumerate(names) if n is not None and n in names[:i]]
    if errors:
        return None, errors
    strategy = get_strategy(clf.cfg.strategy)
    for i, spec in enumerate(specs):  # the label sets as start-up tokenizes them, on the replica's tokenizer
        try:
            PromptLayout.from_spec(clf.tokenizer, spec, strategy, clf.depth.scores)
        except LabelSetError as e:
            text = one_line(e)
            where = "label_end" if "label_end" in text else "template" if "{query}" in text else "labels"
            errors.append(FieldProblem(i, where, text))
    if errors:
        return None, errors
    try:
        new = QclsConfig.model_validate({**clf.cfg.model_dump(), "prompts": [s.model_dump() for s in specs]})
    except ValidationError as e:
        return None, [FieldProblem(None, None, err["msg"].removeprefix("Value error, "))
                      for err in e.errors(include_url=False)]
    why = depth_problem(clf, new)
    return (None, [FieldProblem(None, None, why)]) if why else (new, [])


def depth_problem(clf: "Classifier", new: QclsConfig) -> str | None:
    """Why `new` cannot run on the layers `clf` loaded (heads.depth: Depth.beyond), or None. A reload would refuse
    it after building; said here, before."""
    from qcls.heads import startup
    from qcls.heads.depth import BEYOND_WAY_OUT, plan_depth

    try:
        head = startup.choose(new).head
    except QclsError as e:
        return one_line(e)
    why = plan_depth(clf.depth.total, head, [p.name for p in new.prompts], enabled=new.engine.layer_exit,
                     engine=new.engine.kind).beyond(clf.loaded.layers)
    return why and f"{why}; {BEYOND_WAY_OUT}"
