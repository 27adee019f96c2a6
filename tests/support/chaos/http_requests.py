"""etcd's JSON gateway over HTTP/1.1, as the fault proxy sees it: requests cut whole from the
client's stream (one at a time per connection, bodies with a Content-Length, as leaderd's
aiohttp client sends them) and named by path; answers named only on a watch stream."""

from __future__ import annotations

from .wire import Link

# Request kinds by path; a transaction that deletes (a release, a prune) is "delete".
_PATHS = {
    b"/v3/kv/range": "range",
    b"/v3/kv/txn": "txn",
    b"/v3/kv/deleterange": "delete",
    b"/v3/lease/grant": "grant",
    b"/v3/lease/keepalive": "keepalive",
    b"/v3/lease/timetolive": "timetolive",
    b"/v3/kv/lease/timetolive": "timetolive",
    b"/v3/watch": "watch",
}
KINDS = ("range", "txn", "delete", "grant", "keepalive", "timetolive", "watch")


def request_kind(path: bytes, body: bytes) -> str:
    kind = _PATHS.get(path.split(b"?", 1)[0], "other")
    if kind == "txn" and b"request_delete_range" in body:
        return "delete"
    return kind


class HttpRequests:
    """Client to server: one unit per whole request, named by ``request_kind``; anything
    this does not understand passes through unnamed from then on."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.buffer = b""
        self.opaque = False

    def feed(self, data: bytes) -> list[tuple[str | None, bytes]]:
        if self.opaque:
            return [(None, data)]
        self.buffer += data
        units: list[tuple[str | None, bytes]] = []
        while (unit := self._next()) is not None:
            units.append(unit)
        return units

    def _next(self) -> tuple[str | None, bytes] | None:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return None
        head = self.buffer[:end].split(b"\r\n")
        words = head[0].split(b" ")
        length = _content_length(head[1:])
        if len(words) != 3 or length is None:
            self.opaque, rest, self.buffer = True, self.buffer, b""
            return None, rest
        total = end + 4 + length
        if len(self.buffer) < total:
            return None
        unit, self.buffer = self.buffer[:total], self.buffer[total:]
        self.link.current = kind = request_kind(words[1], unit[end + 4 :])
        return kind, unit


def _content_length(headers: list[bytes]) -> int | None:
    """The body's length (0 without one); None for a chunked body, which is not cut."""
    length = 0
    for line in headers:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            return None
    return length


class HttpAnswers:
    """Server to client: chunks as they come; on a watch stream they are "watch" deliveries."""

    def __init__(self, link: Link) -> None:
        self.link = link

    def feed(self, data: bytes) -> list[tuple[str | None, bytes]]:
        return [("watch" if self.link.current == "watch" else None, data)]
