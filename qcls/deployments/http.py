"""The HTTP face of a replica: FastAPI routes over the deployment's `classify`.

Built per replica (Serve's late-bound ingress) so the limits come from that replica's config. The body is
read and parsed here rather than by FastAPI so that the size limit holds before any parsing and every bad
request gets a message that names the problem and the limit, never a stack trace.

Status codes of POST /v1/classify:
  400 malformed JSON · 413 body over serve.max_body_bytes · 422 wrong types, unknown or missing fields,
  too many queries, or no query could be classified because every query was refused (empty, over
  max_query_tokens) · 500 the engine failed on every query · 503 the engine is unusable (replica being
  replaced; with Retry-After) · 200 otherwise: with several queries, a refused one carries `ok: false` and
  its `error` while the others are classified. `"compact": true` answers with the winners only.

The 200 body is written by `encode.classify_body` (orjson, straight from the result dataclasses); the
pydantic models document it (response_model) and are used for the rare error bodies.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request, Response
from pydantic import BaseModel, ValidationError

from qcls.config.api_key import resolve_api_key
from qcls.deployments.api_key import protect
from qcls.deployments.encode import classify_body
from qcls.deployments.playground import add_playground
from qcls.deployments.schemas import (ClassifyRequest, ClassifyResponse, CompactClassifyResponse, ErrorResponse,
                                      HealthResponse, PromptInfo, PromptsResponse, QueryOut, ReloadInfo,
                                      is_json_error, validation_messages)
from qcls.results.requests import INTERNAL_ERROR, error_kind
from qcls.results import QueryResult

if TYPE_CHECKING:
    from qcls.deployments.app import QclsDeployment

log = logging.getLogger("qcls.serve")

ERRORS = {code: {"model": ErrorResponse, "description": what} for code, what in {
    400: "malformed JSON", 413: "body over serve.max_body_bytes",
    422: "invalid request, or every query refused (empty, over max_query_tokens)",
    500: "the engine failed on every query", 503: "the engine is unusable; the replica is being replaced"}.items()}


class ApiError(Exception):
    def __init__(self, status: int, detail: str, errors: list[str] | None = None,
                 results: list[QueryOut] | None = None):
        super().__init__(detail)
        self.status, self.body = status, ErrorResponse(detail=detail, errors=errors, results=results)


def json_response(model: BaseModel, status: int = 200, retry_after_s: int = 1) -> Response:
    # pydantic writes NaN/inf as null where json.dumps would raise
    headers = {"Retry-After": str(retry_after_s)} if status == 503 else None
    return Response(model.model_dump_json(), status_code=status, media_type="application/json", headers=headers)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to be over `limit` bytes (before any parsing)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise ApiError(400, f"Content-Length {declared!r} is not a byte count")
        if int(declared) > limit:
            raise ApiError(413, f"request body is {int(declared)} bytes, over serve.max_body_bytes={limit}")
    chunks, size = [], 0
    async for chunk in request.stream():  # a chunked body has no Content-Length: count as it arrives
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"request body is over serve.max_body_bytes={limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_request(body: bytes, max_queries: int) -> ClassifyRequest:
    try:
        return ClassifyRequest.model_validate_json(body, context={"max_queries": max_queries})
    except ValidationError as e:
        msgs = validation_messages(e)
        if is_json_error(e):
            raise ApiError(400, "malformed JSON: " + "; ".join(m.removeprefix("Invalid JSON: ") for m in msgs) +
                           ' (expected {"query": "..."} or {"queries": ["...", ...]})', msgs) from None
        raise ApiError(422, "invalid request: " + "; ".join(msgs), msgs) from None


def check_results(results: list[QueryResult], broken: str | None) -> None:
    """Raise the request's error when no query was classified; partial success is a 200."""
    kinds = [error_kind(r) for r in results]
    if any(k is None for k in kinds):
        return
    errors = [r.error or "" for r in results]
    detail = errors[0] if len(errors) == 1 else "no query could be classified: " + "; ".join(
        f"queries[{i}]: {e}" for i, e in enumerate(errors))
    outs = [QueryOut.of(r) for r in results]
    if INTERNAL_ERROR not in kinds:  # every error is the query's own
        raise ApiError(422, detail, errors, outs)
    raise ApiError(503 if broken else 500, detail, errors, outs)


def build_http_app(svc: "QclsDeployment") -> FastAPI:
    # serve.* never changes in a replica's life; the rest of svc.cfg does with a reload, so routes read it per request
    cfg = svc.cfg
    app = FastAPI(title="qcls", version="1", description=(
        f"Query classification with {cfg.model.name}: every prompt's label scores for each query in one "
        "forward. Concurrent requests are batched together."))
    body_doc = {"requestBody": {"required": True, "content": {
        "application/json": {"schema": ClassifyRequest.model_json_schema()}}}}

    retry_after = cfg.serve.retry_after_s

    @app.post("/v1/classify", response_model=ClassifyResponse | CompactClassifyResponse, responses=ERRORS,
              openapi_extra=body_doc, summary="Classify one query or several under every loaded prompt")
    async def classify(request: Request) -> Response:
        try:
            try:
                body = await read_body(request, cfg.serve.max_body_bytes)
                req = parse_request(body, svc.cfg.max_queries_per_request)
            except ApiError as e:
                svc.metrics.refused_query(e.body.detail)
                raise
            results = await svc.classify(req.query_list)
            check_results(results, svc.worker.broken)
            return Response(classify_body(cfg.model.name, results, req.compact), media_type="application/json")
        except ApiError as e:
            return json_response(e.body, e.status, retry_after)
        except Exception as e:  # the traceback goes to the replica log, never to the client
            log.exception("POST /v1/classify failed")
            return json_response(ErrorResponse(detail=f"internal error ({type(e).__name__}); see the replica "
                                               "log"), 500)

    @app.get("/v1/prompts", response_model=PromptsResponse, summary="The active prompts and their labels, the "
             "configuration's fingerprint and how the last reload went")
    async def prompts() -> PromptsResponse:
        active = svc.cfg
        return PromptsResponse(model=active.model.name, strategy=active.strategy, fingerprint=svc.clf.fingerprint,
                               prompts=[PromptInfo(name=p.name, labels=list(p.labels)) for p in active.prompts],
                               reload=ReloadInfo(**svc.reload_state()))

    @app.get("/healthz", response_model=HealthResponse, responses={503: {"model": HealthResponse}},
             summary="200 while the engine answers, 503 once it is unusable")
    async def healthz() -> Response:
        broken = svc.worker.broken
        body = HealthResponse(status="unhealthy" if broken else "ok", model=cfg.model.name,
                              device=str(svc.clf.loaded.device), detail=broken)
        return json_response(body, 503 if broken else 200, retry_after)

    add_playground(app, svc)
    protect(app, resolve_api_key(cfg.serve))
    return app
