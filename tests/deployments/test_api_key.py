"""The API key on a FastAPI app without Ray (the real Serve round trip: test_operations.py)."""
from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from qcls.config import ServeSpec
from qcls.deployments.api_key import ENV_API_KEY, is_loopback, open_to_the_network, protect, resolve_api_key
from qcls.errors import ConfigError


def test_the_key_comes_from_the_config_a_file_or_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_API_KEY, raising=False)
    assert resolve_api_key(ServeSpec()) is None
    monkeypatch.setenv(ENV_API_KEY, " from-env\n")
    assert resolve_api_key(ServeSpec()) == "from-env"
    f = tmp_path / "key"
    f.write_text("from-file\nignored\n")
    assert resolve_api_key(ServeSpec(api_key_file=str(f))) == "from-file"
    assert resolve_api_key(ServeSpec(api_key="inline", api_key_file=str(f))) == "inline"
    with pytest.raises(ConfigError, match="cannot be read"):
        resolve_api_key(ServeSpec(api_key_file=str(tmp_path / "missing")))
    with pytest.raises(ConfigError, match="empty API key"):
        resolve_api_key(ServeSpec(api_key="  "))
    assert "secret" not in repr(ServeSpec(api_key="secret"))


def test_loopback_addresses_and_the_start_up_warning(monkeypatch):
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("myhost")
    monkeypatch.delenv(ENV_API_KEY, raising=False)
    assert "0.0.0.0 without an API key" in open_to_the_network(ServeSpec(host="0.0.0.0"))
    assert open_to_the_network(ServeSpec()) is None  # loopback
    assert open_to_the_network(ServeSpec(host="0.0.0.0", api_key="k")) is None
    monkeypatch.setenv(ENV_API_KEY, "k")
    assert open_to_the_network(ServeSpec(host="0.0.0.0")) is None


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
