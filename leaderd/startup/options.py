"""The command line's options: the daemon's settings (run, check-config, the man page),
the flags of `run -- COMMAND`, and those of the commands that ask a running daemon."""

from __future__ import annotations

import argparse
import re
from typing import Any

from ..api import client

_S, _DEFAULT_FILE = {"type": float, "metavar": "S"}, "/etc/leaderd/leaderd.toml if it exists"
# (flags, argparse options) of run and check-config; help texts also fill the man page.
DAEMON_OPTIONS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("-c", "--config"), {"dest": "config_file", "metavar": "FILE",
                          "help": f"TOML configuration file (default: {_DEFAULT_FILE})"}),
    (("--backend",), {"metavar": "URL", "help": "sqlite:///PATH, postgresql://..., "
                      "postgresql+advisory://..., etcd://..., kubernetes:///NS "
                      "or static:// (default: SQLite)"}),
    (("--election",), {"dest": "elections", "action": "append", "metavar": "NAME",
                       "help": "take part in election NAME (repeatable; default: default)"}),
    (("--node-id",), {"metavar": "ID", "help": "this daemon's unique name (default: host name)"}),
    (("--address",), {"metavar": "ADDR", "help": "published as leader.address while leading"}),
    (("--socket",), {"metavar": "PATH", "help": "the API's Unix socket"}),
    (("--socket-mode",), {"metavar": "MODE", "help": "the socket's permissions (default: 0660)"}),
    (("--listen",), {"metavar": "HOST:PORT", "help": "also serve the API, read-only, on TCP"}),
    (("--ttl",), {**_S, "help": "lease length (default: 15)"}),
    (("--renew-interval",), {**_S, "help": "how often the leader renews (default: 5)"}),
    (("--retry-interval",), {**_S, "help": "how often a follower tries (default: 2)"}),
    (("--clock-drift",), {**_S, "help": "tolerated clock rate difference (default: 0.01)"}),
    (("--safety-margin",), {**_S, "help": "taken off the local deadline (default: 0.2)"}),
    (("--shutdown-timeout",), {**_S, "help": "bound on an orderly stop (default: 10)"}),
    (("--kill-grace",), {**_S, "help": "SIGTERM to SIGKILL for COMMAND (default: 5)"}),
    (("--on-exit",), {"choices": ("release", "restart"),
                      "help": "when COMMAND exits: release the lease, or restart COMMAND"}),
    (("--on-elected",), {"metavar": "CMD", "help": "run CMD (no shell) on becoming leader"}),
    (("--on-demoted",), {"metavar": "CMD", "help": "run CMD on ceasing to lead, done before "
                         "the lease can expire"}),
    (("--on-stop",), {"metavar": "CMD", "help": "run CMD when the daemon stops, before its "
                      "release"}),
    (("--elected-hook-gates",), {"action": "store_const", "const": True, "default": None,
                                 "help": "answer leader only once the elected hook succeeded; "
                                         "a failing hook hands over"}),
    (("--hook-timeout",), {**_S, "help": "hooks are killed after S (default: 5)"}),
    (("--max-connections",), {"type": int, "metavar": "N",
                              "help": "API connections per listener (default: 16384)"}),
    (("--header-timeout",), {**_S, "help": "time to send a request's headers (default: 10)"}),
    (("--keepalive-timeout",), {**_S, "help": "idle connections close after (default: 75)"}),
    (("--check",), {"action": "append", "metavar": "CHECK",
                    "help": "lead only while CHECK passes: exec:CMD, http://HOST:PORT/PATH, "
                            "unix:SOCKET:/PATH or tcp://HOST:PORT (repeatable)"}),
    (("--check-interval",), {**_S, "help": "run each check every S seconds (default: 5)"}),
    (("--check-timeout",), {**_S, "help": "a check not done in S seconds failed (default: 2)"}),
    (("--check-failures",), {"type": int, "metavar": "N",
                             "help": "consecutive failures that make a node unhealthy "
                                     "(default: 3)"}),
    (("--check-successes",), {"type": int, "metavar": "N",
                              "help": "consecutive successes that make it healthy (default: 1)"}),
    (("--check-grace",), {**_S, "help": "failures this long after start do not count "
                                        "(default: 0)"}),
    (("--priority",), {"type": int, "metavar": "N",
                       "help": "higher leads first; 0 never leads, a witness (default: 1)"}),
    (("--failback",), {**_S, "help": "hand over to a healthy standby of higher priority "
                                     "seen for S seconds (default: off)"}),
    (("--on-unhealthy",), {"choices": ("handover", "step-down", "keep"),
                           "help": "a leader whose checks fail with no healthy standby: keep "
                                   "leading until one exists (handover, the default), "
                                   "step down, or keep leading"}),
    (("--label-pod",), {"metavar": "KEY=VALUE", "help": "label this pod KEY=VALUE while it "
                        "leads (Kubernetes; the pod is $POD_NAME, else the host name)"}),
    (("--log-format",), {"choices": ("text", "json"), "help": "text (default) or json"}),
    (("--log-level",), {"metavar": "LEVEL", "help": "debug, info (default), warning, error"}),
]  # fmt: skip


def command_options(run: argparse.ArgumentParser) -> None:
    """Flags of `run -- COMMAND` alone (consul lock's habits), not settings."""
    run.add_argument(
        "--try",
        dest="try_for",
        type=_duration,
        metavar="DURATION",
        help="give up, exit 75, unless leading within DURATION (30, 30s, 5m)",
    )
    run.add_argument("--once-per", type=_duration, metavar="PERIOD",
                     help="run COMMAND on the leader at most once per PERIOD (1h, 30m, 86400), "
                          "recorded in the backend (any but static://)")  # fmt: skip
    run.add_argument(
        "--catch-up",
        action="store_true",
        help="with --once-per: after an outage that missed a period, run at once",
    )
    run.add_argument("--exit-status", choices=("child", "fixed"), default="child",
                     help="exit with the child's status (default), or fixed: 0 if it "
                          "succeeded, 3 if it failed, never leaderd's own 1 or 2")  # fmt: skip


_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)?")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def _duration(text: str) -> float:
    """Seconds from 30, 30s, 500ms, 5m or 1h."""
    found = _DURATION.fullmatch(text.strip())
    seconds = float(found[1]) * _UNITS[found[2] or "s"] if found else 0.0
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is no duration > 0 (e.g. 30, 30s, 5m)")
    return seconds


def daemon_options(p: argparse.ArgumentParser) -> None:
    for flags, options in DAEMON_OPTIONS:
        p.add_argument(*flags, **options)


def client_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--socket", metavar="PATH", help="the daemon's Unix socket (default: "
                   "$LEADERD_SOCKET, the config file's, then the daemon's default)")  # fmt: skip
    p.add_argument(
        "--election", metavar="NAME", help="the election (default: the only one, or default)"
    )
    p.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        default=client.DEFAULT_TIMEOUT,
        help=f"give up after S seconds without an answer (default: {client.DEFAULT_TIMEOUT:g})",
    )
