"""The API key on a replica's routes: with one configured, every route but /healthz (and the playground page's
files) answers 401 without `Authorization: Bearer <key>`; the comparison is constant-time (hmac.compare_digest).
Where the key comes from (serve.api_key, serve.api_key_file, QCLS_API_KEY): qcls/config/api_key.py.
"""
from __future__ import annotations

import hmac
from typing import Any

from qcls.config.api_key import ENV_API_KEY
from qcls.deployments.ingress import send_json_error

OPEN_PATHS = ("/healthz",)  # load balancers and Serve's own checks probe it without a key
# the playground page and its files (playground.py): no data in them, and a browser cannot send a bearer header to
# load a page; the page sends the key it is given on every JSON route
PAGE_PATHS = ("/", "/static/playground.css", "/static/playground.js")
SCHEME = "bearer"


class RequireKey:
    """ASGI middleware: 401 (with `WWW-Authenticate: Bearer`) for any request without the key, but OPEN_PATHS."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode("utf-8")

    async def __call__(self, scope: dict[str, Any], receive, send) -> None:
        if scope["type"] != "http" or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        await send_json_error(send, 401, "missing or wrong API key: send the header Authorization: Bearer <key> "
                              f"(serve.api_key, serve.api_key_file or {ENV_API_KEY})",
                              [(b"www-authenticate", b"Bearer")])

    def _allowed(self, scope: dict[str, Any]) -> bool:
        path, root = scope.get("path", ""), scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):] or "/"
        if path in OPEN_PATHS or path in PAGE_PATHS:
            return True
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                return scheme.lower() == SCHEME.encode() and hmac.compare_digest(token.strip(), self.key)
        return False


def protect(app, key: str | None) -> None:
    """Require `key` on `app` (a FastAPI app) and say so in its OpenAPI schema; nothing when key is None."""
    if key is None:
        return
    app.add_middleware(RequireKey, key=key)
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            schema.setdefault("components", {}).setdefault("securitySchemes", {})["apiKey"] = {
                "type": "http", "scheme": SCHEME,
                "description": "Authorization: Bearer <key> on every route but /healthz"}
            schema["security"] = [{"apiKey": []}]
            for path in OPEN_PATHS:
                for op in schema.get("paths", {}).get(path, {}).values():
                    op["security"] = []
            app.openapi_schema = schema
        return app.openapi_schema
    app.openapi = openapi
