"""Write leaderd(8), the man page, from the command line's own argument parser.

    python packaging/manpage.py > packaging/leaderd.8

The commands and options come from leaderd.startup.cli (so the page cannot drift from --help; a
test regenerates it and compares), the environment variables from leaderd.startup.config.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from leaderd import __version__

from leaderd.startup import cli, config

DESCRIPTION = """\
leaderd takes part in one or more leader elections on behalf of the applications beside
it, and tells them the outcome over a local HTTP API on a Unix socket, so that a program
in any language can gate its work on "am I the leader?" with one curl. A leader keeps
calling itself leader only until its local lease deadline, judged at the moment of each
answer; every lease carries a term, a fencing token that strictly increases.

Backends are chosen by URL: sqlite:///PATH (one host), postgresql://... (a lease row),
postgresql+advisory://... (a session advisory lock), etcd://... (an etcd lease),
static:// (always leader).

Run without a command, leaderd runs the daemon ("run"). Settings come from flags, then
LEADERD_* environment variables, then the TOML file, then built-in defaults."""

API = """\
GET /leader[/ELECTION] answers 200 if this node leads, 503 otherwise.
GET /standby[/ELECTION] answers 200 for a healthy follower that knows the leader.
GET /watch[/ELECTION] long-polls (?revision=N&timeout=S) or streams (?stream=1) changes.
GET /status, /health (liveness), /ready (readiness), /metrics (Prometheus).
POST /resign[/ELECTION]?cooldown=S steps down (Unix socket only).
POST /switchover[/ELECTION]?to=NODE asks whoever leads to hand over to NODE, from any node.
GET /members[/ELECTION] lists every member: leader, standby, unhealthy, witness or stale,
address, last heard, priority and health.
GET /history[/ELECTION]?limit=N lists the terms, newest first, and how each ended.
GET /jobs[/ELECTION] lists run --once-per jobs: last start, end, status, next due."""

EXIT = [
    ("run", "0 clean stop, 1 runtime failure, 2 bad usage or configuration."),
    ("status", "0 this node leads (every election shown), 1 it follows, 2 usage, "
               "3 no daemon answers (within --timeout), 4 its role is unknown (the backend's "
               "last error is printed) or it is stopping."),
    ("switchover", "0 NODE leads (with --at: the request is recorded), 1 refused or not done "
                   "within --timeout, 2 usage, 3 no daemon answers."),
    ("members, history, jobs", "0 answered, 2 usage or unknown election, 3 no daemon answers."),
    ("check-config", "0 the configuration is valid, 2 it is not."),
]  # fmt: skip

FILES = [
    ("/etc/leaderd/leaderd.toml", "the configuration file (every setting commented out: "
                                  "the defaults)"),
    ("/etc/leaderd/leaderd.env", "LEADERD_* settings read by leaderd.service, e.g. a "
                                 "backend URL with a password (mode 0600)"),
    ("/etc/leaderd/NAME.env", "JOB_COMMAND and settings of leaderd@NAME.service"),
    ("/run/leaderd/leaderd.sock", "the API's Unix socket under systemd"),
    ("/var/lib/leaderd/leaderd.db", "the default SQLite backend under systemd"),
]  # fmt: skip


def roff(text: str) -> str:
    """Text escaped for roff: backslashes, hyphens, and control characters at line start."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + line if line[:1] in ".'" else line for line in text.split("\n"))


def commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def option(action: argparse.Action) -> str:
    flags = ", ".join(f"\\fB{roff(flag)}\\fR" for flag in action.option_strings)
    if action.nargs == 0:
        return flags
    metavar = action.metavar or "{" + ",".join(action.choices or []) + "}"
    return f"{flags} \\fI{roff(str(metavar))}\\fR"


def page() -> str:
    parser = cli._parser()
    subs = commands(parser)
    helps = {
        a.dest: a.help
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for a in action._choices_actions
    }
    out = [
        f'.TH LEADERD 8 "" "leaderd {__version__}" "System Administration"',
        ".SH NAME",
        "leaderd \\- leader election sidecar daemon",
        ".SH SYNOPSIS",
    ]
    for sub in subs.values():
        usage = " ".join(sub.format_usage().removeprefix("usage: ").split())
        out += [".PP", roff(usage)]
    out += [".PP", "leaderd \\-\\-version"]
    out += [".SH DESCRIPTION", *paragraphs(DESCRIPTION), ".SH COMMANDS"]
    for name, sub in subs.items():
        out += [f".SS {roff(name)}", roff(helps.get(name) or "")]
        for action in sub._actions:
            if action.option_strings and action.dest != "help":
                out += [".TP", option(action), roff(action.help or "")]
    out += [".SH HTTP API", ".nf", roff(API), ".fi", ".SH ENVIRONMENT"]
    for setting, variable in config._ENV.items():
        out += [".TP", f"\\fB{roff(variable)}\\fR", f"the {roff(setting)} setting"]
    out += [".TP", "\\fBLEADERD_ELECTIONS\\fR", "election names, comma\\-separated"]
    out += [".TP", "\\fBLEADERD_CONFIG\\fR", "the configuration file"]
    out += [".SH FILES"]
    for path, what in FILES:
        out += [".TP", f"\\fI{roff(path)}\\fR", roff(what)]
    out += [".SH EXIT STATUS"]
    for command, what in EXIT:
        out += [".TP", f"\\fB{roff(command)}\\fR", roff(what)]
    out += [
        ".SH SEE ALSO",
        "\\fBsystemctl\\fR(1), \\fBsystemd.service\\fR(5), \\fBcurl\\fR(1); the documents in",
        "\\fI/usr/share/doc/leaderd/\\fR.",
    ]
    return "\n".join(out) + "\n"


def paragraphs(text: str) -> list[str]:
    out = []
    for paragraph in text.split("\n\n"):
        out += [".PP", roff(" ".join(paragraph.split()))]
    return out


if __name__ == "__main__":
    sys.stdout.write(page())
