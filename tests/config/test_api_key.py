"""Where the API key comes from (the config, a file or the environment) and the start-up warning for an address open
to the network without one."""
from __future__ import annotations

import pytest

from qcls.config import ServeSpec
from qcls.config.api_key import ENV_API_KEY, is_loopback, open_to_the_network, resolve_api_key
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
