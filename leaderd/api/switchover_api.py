"""GET, POST and DELETE /switchover (docs/api.md, "Switchover from any node"): on any node,
ask whoever leads to hand the election over to NODE, now or at a given time; see what is
pending; cancel what this node asked for. The request rides on this node's heartbeats
(election/switchover_request.py); these handlers only check it and hand it to the engine.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from .. import jsonio
from ..clock import wall_time
from ..election import switchover
from ..election.engine import Election
from ..election.switchover_request import SwitchoverRequest, pending
from . import params
from .routing import Handler, error, route_get_post_delete

DEFAULT_TIMEOUT = 60.0  # how long a request stands after its time, unless told
MAX_SECONDS = 86400.0
MAX_AT = 1e11  # seconds since the epoch (the year 5138): the command line sends RFC 3339 so


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=jsonio.dumps(data), status=status, content_type="application/json")


def route(app: web.Application, path: str, read: Handler, change: Handler) -> None:
    """GET (HEAD, OPTIONS) answered by ``read``; POST and DELETE by ``change``."""
    route_get_post_delete(app, path, read, change, change)


def answer(election: Election, request: web.Request) -> web.Response:
    """GET, POST or DELETE /switchover of ``election``."""
    if request.method == "POST":
        return ask(election, request.query)
    if request.method == "DELETE":
        return cancel(election)
    return _json(listed(election))


def listed(election: Election) -> dict[str, Any]:
    """The body of GET: the requests not yet expired, this node's own first."""
    wall, me = wall_time(), election.candidate
    members = [v.member for v in election.members().members]
    found = pending(members, wall)
    own = SwitchoverRequest.decode(me.switchover)
    if own is not None and all(by != me.node_id for by, _ in found):
        found.insert(0, (me.node_id, own))  # asked, not yet heard back
    return {"election": election.name, "pending": [r.to_dict(by) for by, r in found]}


def ask(election: Election, query: Any) -> web.Response:
    """POST: record the request in this node's heartbeats; 202 with what is pending."""
    try:
        to = params.node_id(query.get("to"), "to")
        at = params.seconds(query.get("at"), "at", 0.0, MAX_AT)
        stands = params.seconds(query.get("timeout"), "timeout", DEFAULT_TIMEOUT, MAX_SECONDS)
    except params.BadParameter as exc:
        return error(400, "bad_parameter", str(exc))
    if not to:
        return error(400, "bad_parameter", "to must name the node id to hand over to")
    refused = _refusal(election, to)
    if refused is not None:
        return refused
    start = max(at, wall_time())
    election.ask_switchover(SwitchoverRequest(to, start, start + stands).encode())
    return _json(listed(election), status=202)


def cancel(election: Election) -> web.Response:
    """DELETE: withdraw this node's own request; 404 when it asked for none."""
    if SwitchoverRequest.decode(election.candidate.switchover) is None:
        message = f"this node asked for no switchover in election {election.name}"
        return error(404, "no_switchover", message + " (cancel one on the node that asked)")
    election.ask_switchover("")
    return _json(listed(election))


def _refusal(election: Election, to: str) -> web.Response | None:
    if not election.reserves:
        message = f"election {election.name}: this backend has no standbys to hand over to"
        return error(409, "no_standby", message)
    status = election.status()
    if status.leader is not None and status.leader.node_id == to:
        return error(409, "already_leads", f"{to} already leads election {election.name}")
    why = switchover.not_a_standby(election, to)
    return None if why is None else error(why.status, why.code, why.message)
