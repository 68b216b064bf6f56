"""The playground: a page at `/` to try queries and edit prompts in a browser, and the two routes it needs.

    GET  /                  the page (static HTML, CSS and JavaScript shipped in qcls/deployments/static/)
    GET  /v1/check          what `qcls check` knows of the served prompts (qcls/check/served.py)
    PUT  /v1/prompts        a new prompt set: validated against the serving Classifier (qcls/check/prompt_set.py:
                            each problem names its prompt and field), then hot-reloaded through the replica's
                            Reloader (reload.py); `"dry_run": true` only validates

The page and its files carry no data, so they are open with an API key too (a browser cannot send a bearer header
to load a page); every JSON route keeps needing the key. A PUT reaches the replica that answered it: with several
replicas it is refused (their prompt sets would differ); `qcls reload` with the page's downloaded YAML reaches
them all. The deployment's own user_config does not change, so a replica that Serve replaces starts on it.
"""
from __future__ import annotations

import asyncio
import uuid
from dataclasses import asdict
from importlib import resources
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from qcls.check.prompt_set import validate_prompts
from qcls.check.served import served_check
from qcls.config import QclsConfig

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
        new, problems = validate_prompts(svc.clf, update.prompts)
        if problems:
            return answer(422, PromptsUpdateResult(ok=False, detail=f"{len(problems)} problem(s); the served prompts "
                                                   "are unchanged", errors=[FieldError(**asdict(p)) for p in problems]))
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
