"""Configuration precedence and validation: flags > environment > TOML file > defaults."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from leaderd.startup.config import ConfigError, client_socket, load

NO_FLAGS: dict[str, object] = {}


@pytest.fixture(autouse=True)
def no_system_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """This machine's /etc/leaderd/leaderd.toml, if any, must not leak into the tests."""
    monkeypatch.setattr("leaderd.startup.config.DEFAULT_CONFIG_FILE", str(tmp_path / "absent.toml"))


def toml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "leaderd.toml"
    path.write_text(text)
    return str(path)


def test_defaults_with_no_configuration_at_all(tmp_path: Path) -> None:
    env = {"HOSTNAME": "pod-7", "RUNTIME_DIRECTORY": "/run/x", "STATE_DIRECTORY": "/var/lib/x"}
    config = load(NO_FLAGS, env, file=None)
    assert config.node_id == "pod-7"
    assert config.socket == "/run/x/leaderd.sock"
    assert config.backend == "sqlite:///var/lib/x/leaderd.db"
    assert config.state_dir == "/var/lib/x"
    assert config.socket_mode == 0o660 and config.listen is None
    assert [e.name for e in config.elections] == ["default"]
    timing = config.elections[0].timing
    assert (timing.ttl, timing.renew_interval, timing.retry_interval) == (15, 5, 2)


def test_user_defaults_without_systemd_directories() -> None:
    env = {"HOSTNAME": "h", "XDG_RUNTIME_DIR": "/run/user/1000", "XDG_STATE_HOME": "/home/u/.st"}
    config = load(NO_FLAGS, env)
    if os.geteuid() == 0:
        assert config.socket == "/run/leaderd/leaderd.sock"
        assert config.backend == "sqlite:///var/lib/leaderd/leaderd.db"
    else:
        assert config.socket == "/run/user/1000/leaderd.sock"
        assert config.backend == "sqlite:///home/u/.st/leaderd/leaderd.db"


def test_flags_beat_environment_beat_file(tmp_path: Path) -> None:
    path = toml(
        tmp_path,
        """
node_id = "from-file"
backend = "static://"
socket = "/tmp/file.sock"
[defaults]
ttl = 30
renew_interval = 10
[elections.default]
[elections.scheduler]
ttl = 60
""",
    )
    env = {"LEADERD_NODE_ID": "from-env", "LEADERD_SOCKET": "/tmp/env.sock", "HOSTNAME": "h"}
    config = load({"socket": "/tmp/flag.sock"}, env, file=path)
    assert config.node_id == "from-env"
    assert config.socket == "/tmp/flag.sock"
    # A bare static:// keeps its terms in the state directory, so they survive restarts.
    assert config.backend == "static:///var/lib/leaderd/static-terms.json" or (
        os.geteuid() != 0 and config.backend.endswith("/leaderd/static-terms.json")
    )
    assert config.state_dir is not None and config.backend.startswith(
        f"static://{config.state_dir}"
    )
    timings = {e.name: e.timing for e in config.elections}
    assert timings["default"].ttl == 30 and timings["scheduler"].ttl == 60
    assert timings["scheduler"].renew_interval == 10
    # An explicit --ttl wins even over the file's per-election value.
    config = load({"ttl": 45.0}, env, file=path)
    assert {e.timing.ttl for e in config.elections} == {45.0}


def test_elections_from_flags_then_env_then_file(tmp_path: Path) -> None:
    path = toml(tmp_path, "[elections.a]\n[elections.b]\n")
    env = {"HOSTNAME": "h", "LEADERD_ELECTIONS": "x, y"}
    assert [e.name for e in load({"elections": ["z"]}, env, file=path).elections] == ["z"]
    assert [e.name for e in load(NO_FLAGS, env, file=path).elections] == ["x", "y"]
    assert [e.name for e in load(NO_FLAGS, {"HOSTNAME": "h"}, file=path).elections] == ["a", "b"]


def test_config_file_from_environment(tmp_path: Path) -> None:
    path = toml(tmp_path, 'node_id = "n1"\nsocket = "/tmp/configured.sock"\n')
    config = load(NO_FLAGS, {"LEADERD_CONFIG": path})
    assert config.node_id == "n1" and config.config_file == path
    assert client_socket(None, {"LEADERD_CONFIG": path}) == "/tmp/configured.sock"
    assert client_socket("/tmp/flag.sock", {"LEADERD_CONFIG": path}) == "/tmp/flag.sock"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nodeid = 'x'", "unknown setting 'nodeid'"),
        ("[elections.default]\ntll = 3", "unknown setting 'tll' in [elections.default]"),
        ("[defaults]\nttl = 'soon'", "[defaults] ttl must be a number of seconds"),
        ("socket_mode = '0999'", "socket_mode must be octal"),
        ("log_format = 'xml'", "log_format must be one of text, json"),
        ("[elections.'bad name']", "election name 'bad name'"),
        ("kill_grace = 12", "kill_grace (12s) must be less than ttl * (1 - clock_drift)"),
        ("this is not toml", "is not valid TOML"),
        # Each of these crashed the loader with a traceback (exit 1) before the schema.
        ("elections = 5", "elections must be a table of [elections.NAME] tables (got 5)"),
        ("elections = ['a', 'b']", "elections must be a table of [elections.NAME] tables"),
        ("elections = {a = 5}", "[elections] a must be a table of timing settings"),
        ('defaults = "x"', "defaults must be a table of timing settings, [defaults] (got 'x')"),
        ("[defaults]\nttl = true", "[defaults] ttl must be a number of seconds >= 0 (got True)"),
        ("[elections.a]\nttl = [15]", "[elections.a] ttl must be a number of seconds"),
        ("listen = 4040", "listen must be HOST:PORT"),
        ("node_id = 'a b'", "node_id must be 1-253 characters without spaces"),
        ("max_connections = 1.5", "max_connections must be an integer"),
        ("header_timeout = 0", "header_timeout must be a number of seconds > 0"),
        ("a = [" * 2000 + "]" * 2000, "config file"),
    ],
)
def test_bad_file_is_one_clear_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(NO_FLAGS, {"HOSTNAME": "h"}, file=toml(tmp_path, text))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_file_that_is_not_utf8_is_one_clear_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes("node_id = 'n\u0153ud'\n".encode("cp1252"))
    with pytest.raises(ConfigError, match=r"is not UTF-8 text \(byte 12\)"):
        load(NO_FLAGS, {"HOSTNAME": "h"}, file=str(path))


def test_connection_limits_from_file_env_and_flags(tmp_path: Path) -> None:
    path = toml(tmp_path, "max_connections = 100\nheader_timeout = 2.5\n")
    config = load(NO_FLAGS, {"HOSTNAME": "h"}, file=path)
    assert (config.max_connections, config.header_timeout, config.keepalive_timeout) == (
        100,
        2.5,
        75.0,
    )
    env = {"HOSTNAME": "h", "LEADERD_MAX_CONNECTIONS": "200", "LEADERD_KEEPALIVE_TIMEOUT": "5"}
    config = load({"header_timeout": 1.0}, env, file=path)
    assert (config.max_connections, config.header_timeout, config.keepalive_timeout) == (
        200,
        1.0,
        5.0,
    )
    with pytest.raises(ConfigError, match="max_connections must be a whole number"):
        load(NO_FLAGS, {"HOSTNAME": "h", "LEADERD_MAX_CONNECTIONS": "lots"})


def test_missing_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load(NO_FLAGS, {"HOSTNAME": "h"}, file=str(tmp_path / "nope.toml"))


def test_default_kill_grace_fits_short_leases() -> None:
    config = load({"ttl": 2.0, "renew_interval": 0.5, "retry_interval": 0.25}, {"HOSTNAME": "h"})
    assert config.kill_grace == pytest.approx((2 * 0.99 - 0.2 - 0.5) * 0.6)
    assert load(NO_FLAGS, {"HOSTNAME": "h"}).kill_grace == 5.0


def test_listen_forms() -> None:
    env = {"HOSTNAME": "h"}
    assert load({"listen": "0.0.0.0:4040"}, env).listen == ("0.0.0.0", 4040)
    assert load({"listen": "[::1]:4040"}, env).listen == ("::1", 4040)
    assert load({"listen": ":4040"}, env).listen == ("0.0.0.0", 4040)
    with pytest.raises(ConfigError, match="listen must be HOST:PORT"):
        load({"listen": "localhost:99999"}, env)
