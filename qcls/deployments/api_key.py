"""The API key: with one configured, every route but /healthz (and the playground page's files) answers 401 without `Authorization: Bearer <key>`.

Where the key comes from, first found: `serve.api_key` (in the config: visible wherever the config is), the file
`serve.api_key_file` (its first line; read by each replica, so on a cluster it must exist on every node), or the
environment variable QCLS_API_KEY (of the replica process: `qcls serve` passes its own environment to the Ray it
starts; on a cluster set it before `ray start`). The comparison is constant-time (hmac.compare_digest).
"""
from __future__ import annotations

import hmac
import ipaddress
import os
from pathlib import Path
from typing import Any

from qcls.errors import ConfigError

ENV_API_KEY = "QCLS_API_KEY"
OPEN_PATHS = ("/healthz",)  # load balancers and Serve's own checks probe it without a key
# the playground page and its files (playground.py): no data in them, and a browser cannot send a bearer header to
# load a page; the page sends the key it is given on every JSON route
PAGE_PATHS = ("/", "/static/playground.css", "/static/playground.js")
SCHEME = "bearer"


def resolve_api_key(serve) -> str | None:
    """The key `serve` (a ServeSpec) and this process's environment configure, or None (no key: open)."""
    if serve.api_key is not None:
        key, where = serve.api_key, "serve.api_key"
    elif serve.api_key_file is not None:
        path = Path(serve.api_key_file).expanduser()
        try:
            key = path.read_text(encoding="utf-8").splitlines()[0] if path.stat().st_size else ""
        except OSError as e:
            raise ConfigError(f"serve.api_key_file={serve.api_key_file!r} cannot be read ({e.strerror or e})",
                              "give a readable file whose first line is the key (on every node of a cluster), "
                              f"or set {ENV_API_KEY}") from None
        where = f"serve.api_key_file={serve.api_key_file}"
    else:
        key, where = os.environ.get(ENV_API_KEY), ENV_API_KEY
        if key is None:
            return None
    key = key.strip()
    if not key:
        raise ConfigError(f"{where} gives an empty API key", "give a non-empty key, or none to leave the API open")
    return key


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def open_to_the_network(serve) -> str | None:
    """The start-up warning for an address other than loopback without a key, or None."""
    if is_loopback(serve.host) or resolve_api_key(serve) is not None:
        return None
    return (f"serving on {serve.host} without an API key: anyone who can reach this address can use it; set "
            f"{ENV_API_KEY}, serve.api_key_file=FILE or serve.api_key=KEY")


class RequireKey:
    """ASGI middleware: 401 (with `WWW-Authenticate: Bearer`) for any request without the key, but OPEN_PATHS."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode("utf-8")

    async def __call__(self, scope: dict[str, Any], receive, send) -> None:
        if scope["type"] != "http" or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        body = (b'{"detail":"missing or wrong API key: send the header Authorization: Bearer <key> '
                b'(serve.api_key, serve.api_key_file or ' + ENV_API_KEY.encode() + b')"}')
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

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
