"""Transition hooks per election (docs/run.md, "Transition hooks"): an [elections.NAME]
table's hooks beat the file's top level for that election; flags and variables beat both."""

from __future__ import annotations

from pathlib import Path

import pytest

from leaderd.startup.config import ConfigError, load
from tests.startup.test_config import no_system_config, toml

pytestmark = pytest.mark.usefixtures(no_system_config.__name__)

FILE = """
on_elected = "all up"
on_demoted = "all down"
hook_timeout = 1

[elections.db]
on_elected = "vip up 'db address'"
hook_timeout = 0.5

[elections.cron]
on_stop = "cron stop"
elected_hook_gates = true

[elections.plain]
"""
SHORT = "ttl = 2\nrenew_interval = 0.5\nretry_interval = 0.25\n"  # room: 1.28 s


def test_an_elections_table_beats_the_files_top_level(tmp_path: Path) -> None:
    config = load({}, {"HOSTNAME": "h"}, file=toml(tmp_path, FILE))
    hooks = {e.name: e.hooks for e in config.elections}
    assert hooks["db"].on_elected == ("vip", "up", "db address")
    assert hooks["db"].on_demoted == ("all", "down") and hooks["db"].timeout == 0.5
    assert hooks["cron"].on_elected == ("all", "up") and hooks["cron"].on_stop == ("cron", "stop")
    assert hooks["cron"].gates and not hooks["db"].gates and hooks["cron"].timeout == 1
    assert (hooks["plain"].on_elected, hooks["plain"].on_stop) == (("all", "up"), ())


def test_flags_and_variables_beat_an_elections_table(tmp_path: Path) -> None:
    env = {"HOSTNAME": "h", "LEADERD_ON_DEMOTED": "env down"}
    config = load({"on_elected": "flag up"}, env, file=toml(tmp_path, FILE))
    for e in config.elections:
        assert (e.hooks.on_elected, e.hooks.on_demoted) == (("flag", "up"), ("env", "down"))


def test_without_hooks_an_election_has_none(tmp_path: Path) -> None:
    config = load({}, {"HOSTNAME": "h"}, file=toml(tmp_path, "[elections.a]\n[elections.b]\n"))
    assert not any(e.hooks.any for e in config.elections)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[elections.db]\non_elected = \"vip 'up\"",
         "election db: on_elected: No closing quotation in \"vip 'up\""),
        (f"[elections.db]\n{SHORT}on_demoted = 'x'\nhook_timeout = 1.5",
         "election db: hook_timeout (1.5s) must be less than ttl * (1 - clock_drift)"),
        ("[elections.db]\nhook_timeout = 0", "[elections.db] hook_timeout must be a number"),
        ("[elections.db]\non_stop = 3", "[elections.db] on_stop must be a command line"),
        ("[elections.db]\nelected_hook_gates = 'yes'", "[elections.db] elected_hook_gates must be"),
        ("[elections.db]\non_elect = 'x'", "unknown setting 'on_elect' in [elections.db]"),
    ],
)  # fmt: skip
def test_a_bad_hook_setting_of_an_election_is_one_clear_line(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load({}, {"HOSTNAME": "h"}, file=toml(tmp_path, text))
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_a_short_lease_shrinks_only_its_own_elections_default_hook_timeout(
    tmp_path: Path,
) -> None:
    text = f"on_demoted = 'x'\n[elections.short]\n{SHORT}[elections.long]\n"
    config = load({}, {"HOSTNAME": "h"}, file=toml(tmp_path, text))
    timeouts = {e.name: e.hooks.timeout for e in config.elections}
    assert timeouts == {"short": 0.768, "long": 5.0}  # 60% of 2 * 0.99 - 0.2 - 0.5
