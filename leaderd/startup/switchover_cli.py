"""`leaderd switchover --to NODE [--at TIME] [--timeout D]`: from any node, ask whoever leads
to hand the election over to NODE, and wait until NODE leads, or say why not (docs/api.md,
"Switchover from any node"). Standard library only, like the other client commands."""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from .. import jsonio
from ..api import client, handover_wait

EXIT_OK, EXIT_NOT_DONE, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3


def add_parser(sub: Any, client_options: Any) -> None:
    switch = sub.add_parser("switchover", help="from any node: hand the election over to NODE")
    client_options(switch)
    switch.add_argument("--to", required=True, metavar="NODE", help="the standby to lead")
    switch.add_argument("--at", metavar="TIME", help="not before TIME (RFC 3339, e.g. "
                        "2026-11-21T03:00:00Z); the request stands --timeout after it")  # fmt: skip
    switch.add_argument("--json", action="store_true", help="print the status once NODE leads")


def run(args: argparse.Namespace, socket_path: str) -> tuple[int, str]:
    """(exit code, what to print): 0 once NODE leads (with --at: once scheduled); 1 refused
    or not done within --timeout (the request is withdrawn then); 2 bad usage; 3 daemon
    unreachable."""
    try:
        at = None if args.at is None else f"{_epoch(args.at):.3f}"
    except ValueError:
        return EXIT_USAGE, f"--at must be a time like 2026-11-21T03:00:00Z, got {args.at!r}"
    url = client.election_path("/switchover", args.election, to=args.to, at=at,
                               timeout=f"{args.timeout:g}")  # fmt: skip
    try:
        code, body = client.request(socket_path, "POST", url, args.timeout)
        if code != 202:
            failed = EXIT_NOT_DONE if code in (404, 409) else EXIT_USAGE
            return failed, _message(body)
        if args.at is not None:  # scheduled: GET /switchover shows it until then
            return EXIT_OK, f"switchover to {args.to} scheduled at {args.at}"
        status = _status(socket_path, args.election, args.timeout)
        try:
            status = handover_wait.wait_until_leads(
                socket_path, args.election, args.to, status, args.timeout
            )
        except handover_wait.NotTaken as exc:
            delete = client.election_path("/switchover", args.election)
            client.request(socket_path, "DELETE", delete, args.timeout)
            return EXIT_NOT_DONE, f"{exc}; the request is withdrawn"
    except client.Unreachable as exc:
        return EXIT_UNREACHABLE, str(exc)
    if args.json:
        return EXIT_OK, jsonio.dumps(status).decode()
    return EXIT_OK, f"{args.to} leads election {status['election']}, term {status['term']}"


def _status(socket_path: str, election: str | None, timeout: float) -> dict[str, Any]:
    _, status = client.request(socket_path, "GET", client.election_path("/leader", election),
                               timeout)  # fmt: skip
    return dict(status)


def _message(body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message"))
    return f"unexpected answer: {body!r}"


def _epoch(text: str) -> float:
    """RFC 3339 with a zone, as seconds since the epoch."""
    when = dt.datetime.fromisoformat(text.strip().upper().replace("Z", "+00:00"))
    if when.tzinfo is None:
        raise ValueError("no time zone")
    return when.timestamp()
