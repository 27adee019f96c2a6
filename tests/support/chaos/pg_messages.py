"""PostgreSQL's wire protocol (v3), as the fault proxy sees it: the client's messages grouped
into requests (a Parse/Bind/Describe/Execute run up to its Sync, or one Query) named by the
statement they run; the server's NotificationResponses named "notify"."""

from __future__ import annotations

from .wire import Link

# The statements leaderd sends, by what they do: the first pattern found names the kind.
_STATEMENTS = (
    ("listen", (b"LISTEN ",)),
    # The lease row's release (its successor CTE) and the advisory lock's (an UPDATE that
    # clears the holder, or the unlock itself).
    ("release", (b"heir AS MATERIALIZED", b"holder = NULL", b"pg_advisory_unlock")),
    # The lease row's compare-and-set (acquire and renew), the advisory lock (or its try)
    # and its row.
    ("acquire", (b"WITH prev AS", b"advisory_lock(", b"ON CONFLICT (election) DO UPDATE")),
)
KINDS = ("acquire", "release", "read", "listen", "notify")
_SSL_REQUEST, _GSS_REQUEST, _PROTOCOL_3 = 80877103, 80877104, 196608
_EXTENDED = b"PBDEC"  # Parse, Bind, Describe, Execute, Close: a request goes on to its Sync


def statement_kind(text: bytes) -> str:
    for kind, patterns in _STATEMENTS:
        if any(p in text for p in patterns):
            return kind
    return "read"


def _cstrings(body: bytes, count: int) -> list[bytes]:
    return body.split(b"\0", count)[:count]


class PgRequests:
    """Client to server: the startup messages unnamed, then whole requests by statement."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.buffer = b""
        self.started = False
        self.pending: list[bytes] = []
        self.kind: str | None = None

    def feed(self, data: bytes) -> list[tuple[str | None, bytes]]:
        self.buffer += data
        units: list[tuple[str | None, bytes]] = []
        while (message := self._message()) is not None:
            if not self.started:
                units.append((None, message))
                continue
            self.pending.append(message)
            self.kind = self.kind or self._kind(message)
            if message[:1] not in _EXTENDED:
                units.append((self.kind, b"".join(self.pending)))
                self.pending, self.kind = [], None
        return units

    def _message(self) -> bytes | None:
        head = 4 if not self.started else 5
        if len(self.buffer) < head:
            return None
        size = int.from_bytes(self.buffer[head - 4 : head], "big") + head - 4
        if len(self.buffer) < size:
            return None
        message, self.buffer = self.buffer[:size], self.buffer[size:]
        if not self.started:
            code = int.from_bytes(message[4:8], "big")
            self.link.ssl_pending = code in (_SSL_REQUEST, _GSS_REQUEST)
            self.started = code == _PROTOCOL_3
        return message

    def _kind(self, message: bytes) -> str | None:
        tag, body = message[:1], message[5:]
        if tag == b"Q":
            return statement_kind(body)
        if tag == b"P":
            name, text = _cstrings(body, 2)
            kind = statement_kind(text)
            if name:
                self.link.statements[name] = kind
            return kind
        if tag == b"B":
            _, name = _cstrings(body, 2)
            return self.link.statements.get(name)
        return None


class PgAnswers:
    """Server to client: runs of messages, a notification's run named "notify"."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.buffer = b""

    def feed(self, data: bytes) -> list[tuple[str | None, bytes]]:
        self.buffer += data
        units: list[tuple[str | None, bytes]] = []
        if self.link.ssl_pending and self.buffer:
            self.link.ssl_pending = False
            units.append((None, self.buffer[:1]))
            self.buffer = self.buffer[1:]
        while len(self.buffer) >= 5:
            size = 1 + int.from_bytes(self.buffer[1:5], "big")
            if len(self.buffer) < size:
                break
            message, self.buffer = self.buffer[:size], self.buffer[size:]
            kind = "notify" if message[:1] == b"A" else None
            if units and units[-1][0] == kind and units[-1][1][:1] != b"N":
                units[-1] = (kind, units[-1][1] + message)
            else:
                units.append((kind, message))
        return units
