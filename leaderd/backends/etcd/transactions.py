"""The bodies of the etcd backend's transactions (``POST /v3/kv/txn``): the read of a round,
the acquisition, the release and the pruning of a member, made of the keys' operations
(records.py). The grant's is grant.py's. Nothing here sends a request."""

from __future__ import annotations

from typing import Any

import orjson

from .election import EtcdElection
from .gateway import b64
from .records import Keys
from .state import Holder, Round, Spare, State, compare, mine

Operation = dict[str, Any]


def read_txn(e: EtcdElection, ask: Round | None, trim: int | None = None) -> dict[str, Any]:
    """The keys of an election and its members, in one transaction (one revision); with
    ``ask``, that member's heartbeat too, offering its spare; with ``trim``, the history
    records too old for that term deleted."""
    keys = e.keys
    ranges = [{"request_range": {"key": b64(name)}} for name in (keys.leader, keys.term,
                                                                  keys.reserved)]  # fmt: skip
    # The known holder's end record: a read that finds its key gone can tell its release.
    known = e.known_holder
    ended = [keys.read_ended(known.term)] if known is not None else []
    trimmed = keys.trimmed(trim) if trim is not None else []
    return {"success": [*ranges, *heard(e, ask, e.spare), keys.list_members(),
                        keys.list_candidates(), *ended, *trimmed]}  # fmt: skip


def heard(e: EtcdElection, ask: Round | None, spare: Spare | None = None) -> list[Operation]:
    """The operations of a member's heartbeat (and of a term it lost etcd in), and of
    its candidacy: withdrawn when not campaigning, else offering ``spare``."""
    if ask is None:
        return []
    keys = e.keys
    lost = [keys.lost(ask.lost_term)] if ask.lost_term else []
    heard = keys.heard(ask.me, ask.ttl, ask.heard_at, ask.campaigning)
    return [heard, *lost, *_offer(e, ask, spare)]


def _offer(e: EtcdElection, ask: Round, spare: Spare | None) -> list[Operation]:
    """Withdraw the candidacy when not campaigning; offer a spare the candidate key does
    not name yet, kept alive by a known round (grant.py)."""
    me, keys = ask.me, e.keys
    if not ask.campaigning:
        return [keys.withdraw(me)]
    if spare is None or spare.kept_in is None or spare.left() <= 0:
        return []
    if e.state is not None and mine(e.state, me):
        return []
    offered = e.offers.known.get((me.node_id, me.instance))
    if offered is not None and offered.lease == spare.id:
        return []
    return [keys.stand(me, spare.id, ask.ttl)]


def acquire_txn(
    e: EtcdElection, ask: Round, state: State, term: int, spare: Spare
) -> dict[str, Any]:
    """Take the free key under ``spare`` and the next term, or learn who has them; the
    member's heartbeat either way, and the new term's history record on success (with the
    records past the retention deleted)."""
    me, keys, acquired_at = ask.me, e.keys, ask.heard_at
    value = {"node_id": me.node_id, "address": me.address, "instance": me.instance,
             "term": term, "acquired_at": acquired_at}  # fmt: skip
    key, term_key, reserved_key = b64(keys.leader), b64(keys.term), b64(keys.reserved)
    return {
        # The reservation is as read: none, or this node's (which the acquisition ends).
        "compare": [
            compare(key, "CREATE", 0),
            compare(term_key, "MOD", state.term_modified),
            compare(reserved_key, "CREATE", state.reserved.created),
        ],
        # A holder is no candidate: the acquisition withdraws our candidacy.
        "success": [
            {"request_put": {"key": key, "value": b64(orjson.dumps(value)), "lease": spare.id}},
            {"request_put": {"key": term_key, "value": b64(str(term))}},
            {"request_delete_range": {"key": reserved_key}},
            keys.began(me, term, acquired_at),
            *keys.trimmed(term),
            *heard(e, ask),
            keys.withdraw(me),
            keys.list_members(),
        ],
        "failure": [
            *({"request_range": {"key": k}} for k in (key, term_key, reserved_key)),
            *heard(e, ask, spare),
            keys.list_members(),
            keys.list_candidates(),
        ],
    }


def release_txn(
    keys: Keys, holder: Holder, ended: Operation, reserved: tuple[str, int] | None
) -> dict[str, Any]:
    """Delete our key while it is as our tenure began, recording how it ``ended``; with
    ``reserved`` (node id, etcd lease), keep the free lease for that node meanwhile."""
    key = b64(keys.leader)
    success: list[Operation] = [{"request_delete_range": {"key": key}}, ended]
    if reserved is not None:
        node_id, lease = reserved
        put = {"key": b64(keys.reserved), "value": b64(node_id), "lease": lease}
        success.append({"request_put": put})
    return {"compare": [compare(key, "MOD", holder.modified)], "success": success}


def prune_txn(keys: Keys, member: str, revision: int) -> dict[str, Any]:
    """Delete the member key ``member``, and its candidacy, if still at ``revision``."""
    offered = member.replace(keys.members, keys.candidates, 1)  # its candidacy goes too
    return {
        "compare": [compare(b64(member), "MOD", revision)],
        "success": [{"request_delete_range": {"key": b64(k)}} for k in (member, offered)],
    }
