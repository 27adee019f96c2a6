"""Configuration errors are caught before start (docs/operations.md, "Configuration"):
`check-config` and `run` both exit 2 with one line, so systemd's RestartPreventExitStatus=2
ends the restart loop. Each case passed check-config and failed (exit 1) or hung at run time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.daemons import leaderd_cli

pytestmark = pytest.mark.slow


CASES = [
    (["--backend", "sqlite:///proc/x.db"], {}, "SQLite file /proc/x.db: cannot create files"),
    (["--backend", "sqlite:///nowhere/x.db"], {}, "cannot create files in /nowhere"),
    (["--backend", "postgresql://u@127.0.0.1:99999/db"], {}, "port '99999' must be 1-65535"),
    (["--backend", "postgresql://u:hunter2@127.0.0.1/db?sslmode=bogus"], {},
     "sslmode must be one of disable, allow"),
    (["--backend", "postgresql+advisory://u@h/db?target_session_attrs=main"], {},
     "target_session_attrs must be one of"),
    (["--backend", "etcd://127.0.0.1:0"], {}, "port '0' must be 1-65535"),
    (["--backend", "static://", "--listen", "bogus.invalid:4040"], {},
     "listen bogus.invalid:4040: "),
    (["--backend", "static://", "--listen", "192.0.2.1:4040"], {},
     "listen 192.0.2.1:4040: 192.0.2.1 is no address of this host"),
    (["--backend", "static://"], {"LEADERD_TTLL": "3"},
     "unknown environment variable LEADERD_TTLL (did you mean LEADERD_TTL?)"),
    (["--backend", "static://"], {"LEADERD_BAKEND": "static://"},
     "unknown environment variable LEADERD_BAKEND (did you mean LEADERD_BACKEND?)"),
]  # fmt: skip


@pytest.mark.parametrize(("flags", "env", "rule"), CASES)
@pytest.mark.parametrize("command", ["check-config", "run"])
def test_configuration_error_exits_2_with_one_line(
    workdir: str, command: str, flags: list[str], env: dict[str, str], rule: str
) -> None:
    env = {"STATE_DIRECTORY": workdir, **env}
    done = leaderd_cli(command, "--socket", f"{workdir}/x.sock", *flags, env=env, timeout=20)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("leaderd: ") and rule in line, line
    assert "hunter2" not in line and done.stdout == ""


def test_variables_leaderd_sets_for_its_command_are_no_error(workdir: str) -> None:
    """A leaderd started by a job inherits LEADERD_TERM and LEADERD_ELECTION."""
    env = {"STATE_DIRECTORY": workdir, "LEADERD_TERM": "7", "LEADERD_ELECTION": "jobs"}
    done = leaderd_cli("check-config", "--backend", "static://", env=env)
    assert done.returncode == 0, done.stderr


def test_check_config_names_the_file_and_writes_urls_as_users_do(workdir: str) -> None:
    config = Path(workdir) / "leaderd.toml"
    config.write_text(f'backend = "sqlite://{workdir}/lease.db"\nlisten = "[::1]:4040"\n')
    env = {"STATE_DIRECTORY": workdir}
    done = leaderd_cli("check-config", "-c", str(config), "--socket", f"{workdir}/s", env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].endswith(f"backend sqlite://{workdir}/lease.db"), lines
    assert lines[1] == f"config file {config}"
    assert lines[2] == f"socket {workdir}/s, listen [::1]:4040"
    flags = ["--backend", "static://", "--listen", "127.0.0.1:4040"]
    done = leaderd_cli("check-config", *flags, env={**env, "LEADERD_CONFIG": ""})
    assert done.returncode == 0, done.stderr
    assert "config file none" in done.stdout and "listen 127.0.0.1:4040" in done.stdout
    assert f"backend static://{workdir}/static-terms.json" in done.stdout
