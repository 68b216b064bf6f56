"""The API key on a FastAPI app without Ray (where the key comes from: tests/config/test_api_key.py; the real Serve
round trip: test_operations.py)."""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient

from qcls.deployments.api_key import protect


def _app(key):
    app = FastAPI()
    app.get("/healthz")(lambda: {"status": "ok"})
    app.get("/v1/prompts")(lambda: {"prompts": []})
    protect(app, key)
    return TestClient(app)


def test_every_route_but_healthz_needs_the_key():
    c = _app("s3cret")
    for path in ("/v1/prompts", "/openapi.json", "/docs"):
        r = c.get(path)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", path
        assert "Authorization: Bearer" in r.json()["detail"]
        assert c.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get(path, headers={"Authorization": "Basic s3cret"}).status_code == 401
        assert c.get(path, headers={"Authorization": "Bearer s3cret"}).status_code == 200, path
    assert c.get("/healthz").status_code == 200
    schema = c.get("/openapi.json", headers={"authorization": "bearer s3cret"}).json()
    assert schema["components"]["securitySchemes"]["apiKey"] == {
        "type": "http", "scheme": "bearer", "description": "Authorization: Bearer <key> on every route but /healthz"}
    assert schema["security"] == [{"apiKey": []}] and schema["paths"]["/healthz"]["get"]["security"] == []


def test_without_a_key_nothing_changes():
    c = _app(None)
    assert c.get("/v1/prompts").status_code == 200 and "security" not in c.get("/openapi.json").json()
