"""The playground: a page at `/` to try queries and edit prompts in a browser, and the two routes it needs.

    GET  /                  the page (static HTML, CSS and JavaScript shipped in qcls/deployments/static/)
    GET  /v1/check          what `qcls check` knows of the served prompts (qcls/check/served.py)
    PUT  /v1/prompts        a new prompt set: validated here (each problem names its prompt and field), then
                            hot-reloaded through the replica's Reloader (reload.py); `"dry_run": true` only validates

The page and its files carry no data, so they are open with an API key too (a browser cannot send a bearer header
to load a page); every JSON route keeps needing the key. A PUT reaches the replica that answered it: with several
replicas it is refused (their prompt sets would differ); `qcls reload` with the page's downloaded YAML reaches
them all. The deployment's own user_config does not change, so a replica that Serve replaces starts on it.
"""
from __future__ import annotations

import asyncio
import uuid
from importlib import resources
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from qcls.check.served import served_check
from qcls.config import PromptSpec, QclsConfig
from qcls.errors import LabelSetError

if TYPE_CHECKING:
    from qcls.deployments.app import QclsDeployment

STATIC = {"playground.css": "text/css", "playground.js": "text/javascript"}  # api_key.PAGE_PATHS opens them
RELOAD_GUARD_S = 900.0  # a hang guard on the build, as `qcls reload`'s wait


class FieldError(BaseModel):
    prompt: int | None = Field(description="the prompt's position in the request (null: the whole set)")
    field: str | None = Field(description="name, template, label_prefix, label_end or labels (null: the whole set)")
    message: str


class PromptsUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompts: list[dict[str, Any]] = Field(description="the whole new prompt set: name, template, label_prefix, "
                                          "labels (and label_end), as in prompts/NAME.yaml")
    dry_run: bool = Field(default=False, description="validate only")


class PromptsUpdateResult(BaseModel):
    ok: bool
    detail: str
    errors: list[FieldError] = []
    fingerprint: str | None = None
    prompts: list[str] = []


def static_text(name: str) -> str:
    return resources.files("qcls.deployments").joinpath("static", name).read_text(encoding="utf-8")


def validate_prompts(svc: "QclsDeployment", raw: list[dict[str, Any]]) -> tuple[QclsConfig | None, list[FieldError]]:
    """The configuration serving these prompts instead, or every problem found, each beside its prompt and field."""
    from qcls.engine.layout import PromptLayout
    from qcls.scoring.strategies import get_strategy

    clf = svc.clf
    errors, specs = [], []
    for i, given in enumerate(raw):
        try:
            specs.append(PromptSpec.model_validate(given))
        except ValidationError as e:
            for err in e.errors(include_url=False):
                where = str(err["loc"][0]) if err["loc"] else None
                errors.append(FieldError(prompt=i, field=where, message=err["msg"].removeprefix("Value error, ")))
    names = [str(given.get("name")) if isinstance(given, dict) else None for given in raw]
    errors += [FieldError(prompt=i, field="name", message=f"another prompt is named {n!r}: names must be distinct")
               for i, n in enumerate(names) if n is not None and n in names[:i]]
    if errors:
        return None, errors
    strategy = get_strategy(clf.cfg.strategy)
    for i, spec in enumerate(specs):  # the label sets as start-up tokenizes them, on the replica's tokenizer
        try:
            PromptLayout.from_spec(clf.tokenizer, spec, strategy, clf.depth.scores)
        except LabelSetError as e:
            text = " ".join(str(e).split("\n"))
            where = "label_end" if "label_end" in text else "template" if "{query}" in text else "labels"
            errors.append(FieldError(prompt=i, field=where, message=text))
    if errors:
        return None, errors
    try:
        new = QclsConfig.model_validate({**clf.cfg.model_dump(), "prompts": [s.model_dump() for s in specs]})
    except ValidationError as e:
        return None, [FieldError(prompt=None, field=None, message=err["msg"].removeprefix("Value error, "))
                      for err in e.errors(include_url=False)]
    why = depth_problem(clf, new)
    return (None, [FieldError(prompt=None, field=None, message=why)]) if why else (new, [])


def depth_problem(clf, new: QclsConfig) -> str | None:
    """Why `new` cannot run on the layers this replica loaded (heads.depth: Depth.beyond), or None. A reload would
    refuse it after building; said here, before."""
    from qcls.errors import QclsError
    from qcls.heads import startup
    from qcls.heads.depth import BEYOND_WAY_OUT, plan_depth

    try:
        head = startup.choose(new).head
    except QclsError as e:
        return " ".join(str(e).split("\n"))
    why = plan_depth(clf.depth.total, head, [p.name for p in new.prompts], enabled=new.engine.layer_exit,
                     engine=new.engine.kind).beyond(clf.loaded.layers)
    return why and f"{why}; {BEYOND_WAY_OUT}"


async def reload_to(svc: "QclsDeployment", cfg: QclsConfig) -> dict[str, Any]:
    """Hand `cfg` to the replica's Reloader (built beside the serving one, then swapped) and wait for its outcome."""
    rid = "playground-" + uuid.uuid4().hex[:12]
    svc.reloader.request({"config": cfg.model_dump(mode="json", exclude={"serve"}), "id": rid})
    state = await asyncio.to_thread(svc.reloader.outcome, rid, RELOAD_GUARD_S)
    if state is None:
        return {**svc.reload_state(), "status": "refused",
                "detail": f"the build did not finish within {RELOAD_GUARD_S:g} s"}
    return state


def add_playground(app: FastAPI, svc: "QclsDeployment") -> None:
    page = static_text("index.html")

    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        return Response(page, media_type="text/html; charset=utf-8")

    for name, kind in STATIC.items():
        body = static_text(name)
        app.add_api_route(f"/static/{name}", lambda body=body, kind=kind: Response(body, media_type=kind),
                          methods=["GET"], include_in_schema=False)

    @app.get("/v1/check", summary="What `qcls check` knows of the served prompts: label tokens, shared first tokens, "
             "tokens per forward and their projected T4 time")
    async def check(query_tokens: int = Query(8, ge=1, description="tokens per query (at most max_query_tokens)")
                    ) -> dict[str, Any]:
        return served_check(svc.clf, query_tokens)

    @app.put("/v1/prompts", response_model=PromptsUpdateResult, summary="Replace the prompt set (validated, then "
             "hot-reloaded on this replica; the old prompts answer until the new ones are built)",
             responses={409: {"model": PromptsUpdateResult}, 422: {"model": PromptsUpdateResult}})
    async def put_prompts(request: Request) -> Response:
        def answer(status: int, result: PromptsUpdateResult) -> Response:
            return Response(result.model_dump_json(), status_code=status, media_type="application/json")
        body, limit = await request.body(), svc.cfg.serve.max_body_bytes
        if len(body) > limit:
            return answer(413, PromptsUpdateResult(ok=False, detail=f"request body is {len(body)} bytes, over "
                                                   f"serve.max_body_bytes={limit}"))
        try:
            update = PromptsUpdate.model_validate_json(body)
        except ValidationError as e:
            return answer(422, PromptsUpdateResult(ok=False, detail="invalid request: " + "; ".join(
                err["msg"] for err in e.errors(include_url=False))))
        new, errors = validate_prompts(svc, update.prompts)
        if errors:
            return answer(422, PromptsUpdateResult(ok=False, detail=f"{len(errors)} problem(s); the served prompts "
                                                   "are unchanged", errors=errors))
        if update.dry_run:
            return answer(200, PromptsUpdateResult(ok=True, detail="valid", prompts=[p.name for p in new.prompts]))
        s = svc.cfg.serve
        if s.autoscaling or s.num_replicas != 1:
            return answer(409, PromptsUpdateResult(ok=False, detail="this deployment has several replicas and a "
                                                   "PUT reaches one of them: download the prompt set and run `qcls "
                                                   "--config-dir DIR reload … prompts=NAME`, which reloads them all"))
        state = await reload_to(svc, new)
        if state["status"] == "refused":
            return answer(409, PromptsUpdateResult(ok=False, detail=f"reload refused, the old prompts keep serving: "
                                                   f"{state['detail']}", fingerprint=state["fingerprint"],
                                                   prompts=state["prompts"]))
        return answer(200, PromptsUpdateResult(ok=True, detail="serving", fingerprint=state["fingerprint"],
                                               prompts=state["prompts"]))
