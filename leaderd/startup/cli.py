"""The command line (README, docs/api.md): run the daemon, or ask a running one.

Exit codes: run: 0 clean stop, 1 runtime failure, 2 bad usage or configuration.
status: 0 leader, 1 follower, 2 usage, 3 daemon unreachable, 4 role unknown (or stopping).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from .. import __version__, jsonio
from ..api import client, handover_wait
from . import early_signals, jobs_cli, lean_imports, options, switchover_cli
from .config import Config, ConfigError, client_socket, listen_text, load

EXIT_OK, EXIT_NOT_LEADER, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_UNKNOWN = 0, 1, 2, 3, 4
COMMANDS = (
    "run",
    "status",
    "watch",
    "resign",
    "switchover",
    "members",
    "history",
    "jobs",
    "check-config",
)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command: list[str] | None = None
    if "--" in args:
        split = args.index("--")
        args, command = args[:split], args[split + 1 :]
    if not args or (args[0] not in COMMANDS and args[0] not in ("-h", "--help", "--version")):
        args = ["run", *args]  # a bare `leaderd [options]` runs the daemon
    parsed = _parser().parse_args(args)
    if parsed.command is None:
        _parser().print_help()
        return EXIT_USAGE
    if command is not None and parsed.command != "run":
        print(f"leaderd {parsed.command}: '-- COMMAND' only goes with run", file=sys.stderr)
        return EXIT_USAGE
    if command == []:
        # leaderd@NAME runs `leaderd run ... -- $JOB_COMMAND`: an unset variable lands here.
        print(
            "leaderd run: no COMMAND after '--' (leaderd@NAME: set JOB_COMMAND in "
            "/etc/leaderd/NAME.env)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        if parsed.command == "run":
            return _run(parsed, command or [])
        early_signals.release()  # blocked since leaderd's first line; Ctrl-C stops a client
        handler = {
            "check-config": _check_config,
            "status": _status,
            "watch": _watch,
            "resign": _resign,
            "members": _members,
            "history": _history,
            "switchover": _switchover,
            "jobs": _jobs,
        }[parsed.command]
        return handler(parsed)
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="leaderd", description="Leader election sidecar.")
    parser.add_argument("--version", action="version", version=f"leaderd {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = sub.add_parser(
        "run",
        help="run the daemon (the default) [-- COMMAND [ARG...]]",
        usage="leaderd run [options] [-- COMMAND [ARG...]]",
        description="Run the daemon; with -- COMMAND, run COMMAND only while leading.",
    )
    options.daemon_options(run)
    options.command_options(run)
    check = sub.add_parser("check-config", help="validate the configuration and exit")
    options.daemon_options(check)
    status = sub.add_parser("status", help="who leads; exit 0 if this node does")
    options.client_options(status)
    status.add_argument(
        "--json", action="store_true", help="print GET /status (elections keyed by name)"
    )
    status.add_argument("-q", "--quiet", action="store_true", help="print nothing")
    watch = sub.add_parser("watch", help="print one line per change")
    options.client_options(watch)
    watch.add_argument("--json", action="store_true", help="print one JSON object per change")
    resign = sub.add_parser("resign", help="step down now")
    options.client_options(resign)
    resign.add_argument(
        "--cooldown", type=float, metavar="S", help="do not campaign for S seconds (default: ttl)"
    )
    resign.add_argument(
        "--to",
        metavar="NODE",
        help="hand over to this live standby (reserved for it for one ttl) and wait, up to "
        "--timeout, until it leads",
    )
    resign.add_argument("--json", action="store_true", help="print the JSON answer")
    members = sub.add_parser("members", help="every member: role, address, last heard")
    options.client_options(members)
    members.add_argument("--json", action="store_true", help="print the JSON answer")
    switchover_cli.add_parser(sub, options.client_options)
    history = sub.add_parser("history", help="who led, from when to when, and how it ended")
    options.client_options(history)
    history.add_argument("--limit", type=int, metavar="N", help="newest N records (default: 20)")
    history.add_argument("--json", action="store_true", help="print the JSON answer")
    jobs_cli.add_parser(sub, options.client_options)
    return parser


def _config(args: argparse.Namespace, command: list[str]) -> Config:
    from . import preflight

    config = load(vars(args), file=args.config_file)
    if command and len(config.elections) != 1:
        names = ", ".join(e.name for e in config.elections)
        raise ConfigError(f"run -- COMMAND takes exactly one election (got {names})")
    if getattr(args, "try_for", None) is not None and not command:
        raise ConfigError("--try goes with -- COMMAND")
    if misuse := jobs_cli.misuse(args, command, config.backend):
        raise ConfigError(misuse)
    preflight.check(config)
    return config


def _run(args: argparse.Namespace, command: list[str]) -> int:
    early_signals.hold()  # a stop since the first line, or during the imports below, exits 0
    lean_imports.import_aiohttp()
    try:
        config = _config(args, command)
    except ConfigError as exc:
        print(f"leaderd: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from . import daemon, logs

    logs.setup(config.log_format, config.log_level)
    job = None
    if command:
        fixed = args.exit_status == "fixed"
        job = daemon.Job(command, args.try_for, fixed, args.once_per, args.catch_up)
    _exit_now(daemon.run(config, job))


def _exit_now(code: int) -> NoReturn:
    """End the daemon without the interpreter's teardown. By now every lease is released,
    the child stopped and every socket closed; freeing the heap object by object would take
    a core for about 100 ms, while the successor (often on the same host) takes over."""
    logging.shutdown()  # what the teardown would still do: flush the log
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _check_config(args: argparse.Namespace) -> int:
    from ..backends import redact_url

    try:
        config = _config(args, [])
    except ConfigError as exc:
        print(f"leaderd: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"config ok: node {config.node_id}, backend {redact_url(config.backend)}")
    print(f"config file {config.config_file or 'none (flags, environment and defaults)'}")
    print(f"socket {config.socket}, listen {listen_text(config.listen)}")
    for e in config.elections:
        t = e.timing
        timing = f"ttl {t.ttl:g}s, renew {t.renew_interval:g}s, retry {t.retry_interval:g}s"
        who = e.eligibility
        checks = ", ".join(c.target for c in who.checks) or "none"
        print(f"election {e.name}: {timing}; priority {who.priority}, checks: {checks}")
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    """Every election (or --election's) in one table; exit 0 only if this node leads every
    one, 4 if its role in one is unknown (the backend's last error tells why)."""
    path = client_socket(args.socket)
    try:
        code, node = client.request(path, "GET", "/status", args.timeout)
    except client.Unreachable as exc:
        return _fail(exc, EXIT_UNREACHABLE, args.quiet)
    if code != 200 or not isinstance(node, dict):
        return _fail(_error_message(node), EXIT_USAGE, args.quiet)
    elections = node["elections"]
    if args.election is not None:
        if args.election not in elections:
            here = ", ".join(elections)
            return _fail(
                f"unknown election {args.election!r} (here: {here})", EXIT_USAGE, args.quiet
            )
        node["elections"] = {args.election: elections[args.election]}
    statuses = list(node["elections"].values())
    if args.json:
        sys.stdout.write(jsonio.dumps(node, indent=True).decode() + "\n")
    elif not args.quiet:
        sys.stdout.write(_table(statuses) + _checks(node.get("checks", [])))
    return _status_code(statuses, node["backend"]["last_error"], args.quiet)


def _status_code(statuses: list[dict[str, Any]], last_error: str | None, quiet: bool) -> int:
    if all(s["is_leader"] for s in statuses):
        return EXIT_OK
    unknown = [s["election"] for s in statuses if s["role"] in ("unknown", "stopped")]
    if unknown:
        reason = f"role unknown in {', '.join(unknown)}: {last_error or 'not known yet'}"
        return _fail(reason, EXIT_UNKNOWN, quiet)
    return EXIT_NOT_LEADER


def _watch(args: argparse.Namespace) -> int:
    path = client_socket(args.socket)
    url = client.election_path("/watch", args.election, stream=1)
    try:
        for code, status in client.stream(path, url, args.timeout):
            if code != 200:
                return _fail(_error_message(status, path, args), EXIT_USAGE, False)
            line = jsonio.dumps(status).decode() if args.json else _line(status)
            print(line, flush=True)
    except client.Unreachable as exc:
        return _fail(exc, EXIT_UNREACHABLE, False)
    return EXIT_OK


def _resign(args: argparse.Namespace) -> int:
    path = client_socket(args.socket)
    cooldown = None if args.cooldown is None else f"{args.cooldown:g}"
    url = client.election_path("/resign", args.election, cooldown=cooldown, to=args.to)
    try:
        code, body = client.request(path, "POST", url, args.timeout)
    except client.Unreachable as exc:
        return _fail(exc, EXIT_UNREACHABLE, False)
    if code != 200:
        # 409: nothing to hand over from here (not the leader, or no standby can exist).
        failed = EXIT_NOT_LEADER if code == 409 else EXIT_USAGE
        return _fail(_error_message(body, path, args), failed, False)
    if args.to:
        try:
            body = handover_wait.wait_until_leads(path, args.election, args.to, body, args.timeout)
        except client.Unreachable as exc:
            return _fail(exc, EXIT_UNREACHABLE, False)
        except handover_wait.NotTaken as exc:
            return _fail(exc, EXIT_NOT_LEADER, False)
        if not args.json:
            print(f"handed election {body['election']} over to {args.to}, term {body['term']}")
            return EXIT_OK
    print(jsonio.dumps(body).decode() if args.json else _line(body))
    return EXIT_OK


def _members(args: argparse.Namespace) -> int:
    """Like `patronictl list`: one line per member, the leader first."""
    body = _get(args, "/members")
    if not isinstance(body, dict):
        return body
    if not args.json:
        rows = [("MEMBER", "ROLE", "PRIORITY", "ADDRESS", "VERSION", "LAST HEARD", "AGE",
                 "HEALTH")]  # fmt: skip
        for m in body["members"]:
            role = m["role"] + (" (conflict)" if m["conflict"] else "")
            age = f"{m['age_ms'] / 1000:.1f}s"
            rows.append((m["node_id"], role, str(m.get("priority", 1)), m["address"] or "-",
                         m["version"] or "-", m["last_heard_at"] or "-", age,
                         m.get("health") or "ok"))  # fmt: skip
        summary = (
            f"election {body['election']}, term {body['term']}: {body['cluster_size']} live, "
            f"{body['healthy_standbys']} healthy standby(s), "
            f"cluster {'ready' if body['cluster_ready'] else 'NOT ready'}\n"
        )
        sys.stdout.write(summary + _columns(rows))
    return EXIT_OK


def _switchover(args: argparse.Namespace) -> int:
    code, said = switchover_cli.run(args, client_socket(args.socket))
    if code == EXIT_OK:
        print(said)
        return code
    return _fail(said, code, False)


def _history(args: argparse.Namespace) -> int:
    body = _get(args, "/history", limit=args.limit)
    if not isinstance(body, dict):
        return body
    if not args.json:
        rows = [("TERM", "HOLDER", "ADDRESS", "ACQUIRED AT", "ENDED AT", "HOW IT ENDED")]
        for r in body["records"]:
            rows.append((str(r["term"]), r["holder"], r["address"] or "-", r["acquired_at"] or "-",
                         r["ended_at"] or "-", r["end_reason"] or "(leading)"))  # fmt: skip
        sys.stdout.write(_columns(rows))
    return EXIT_OK


def _jobs(args: argparse.Namespace) -> int:
    body = _get(args, "/jobs")
    return jobs_cli.show(body, args.json, _columns) if isinstance(body, dict) else body


def _get(args: argparse.Namespace, base: str, **query: Any) -> dict[str, Any] | int:
    """GET an election's answer; print it with --json. An exit code if it failed."""
    path = client_socket(args.socket)
    url = client.election_path(base, args.election, **query)
    try:
        code, body = client.request(path, "GET", url, args.timeout)
    except client.Unreachable as exc:
        return _fail(exc, EXIT_UNREACHABLE, False)
    if code != 200 or not isinstance(body, dict):
        return _fail(_error_message(body, path, args), EXIT_USAGE, False)
    if args.json:
        sys.stdout.write(jsonio.dumps(body, indent=True).decode() + "\n")
    return body


def _table(statuses: list[dict[str, Any]]) -> str:
    header = ("ELECTION", "ROLE", "LEADER", "ADDRESS", "TERM", "LEASE LEFT", "SINCE")
    rows = [header]
    for s in statuses:
        leader = s["leader"] or {}
        lease = f"{s['lease']['valid_for_ms'] / 1000:.1f}s" if s["lease"] else "-"
        rows.append(
            (
                s["election"],
                s["role"],
                leader.get("node_id") or "-",
                leader.get("address") or "-",
                str(s["term"]),
                lease,
                s["changed_at"],
            )
        )
    return _columns(rows)


def _checks(checks: list[dict[str, Any]]) -> str:
    """The health checks under the elections' table, one line each."""
    return "".join(
        f"check {c['check']}: {c['state']}, {c['consecutive_failures']} failure(s) in a row, "
        f"last: {c['output']}\n"
        for c in checks
    )


def _columns(rows: Sequence[tuple[str, ...]]) -> str:
    """Rows as left-aligned columns, two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n" for r in rows
    )


def _line(s: dict[str, Any]) -> str:
    leader = (s.get("leader") or {}).get("node_id") or "none"
    return (
        f"{s['changed_at']} {s['election']} revision {s['revision']}: {s['role']}, "
        f"leader {leader}, term {s['term']}"
    )


def _error_message(body: Any, socket_path: str = "", args: argparse.Namespace | None = None) -> str:
    """The API's error message; without --election while several run, which flag to add."""
    if not (isinstance(body, dict) and isinstance(body.get("error"), dict)):
        return f"unexpected answer: {body!r}"
    code = body["error"].get("code")
    if args is not None and args.election is None and code == "unknown_election":
        try:
            _, node = client.request(socket_path, "GET", "/status", args.timeout)
            names = ", ".join(node["elections"])
        except (client.Unreachable, KeyError, TypeError):
            names = "several"
        return f"several elections run here ({names}): name one with --election NAME"
    return str(body["error"].get("message", body["error"]))


def _fail(message: object, code: int, quiet: bool) -> int:
    if not quiet:
        print(f"leaderd: {message}", file=sys.stderr)
    return code
