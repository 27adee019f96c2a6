"""/leader answers through routing.route_instant (no wrapper around the handler): its
connection must still end the request as tracked ones do, so a keep-alive client that waits
after the answer is closed as idle (keepalive_timeout), never as a client slow to send its
headers (header_timeout, with a 408)."""

from __future__ import annotations

import asyncio

from leaderd.api.connections import Limits

from .test_connections import Serve, served  # noqa: F401 - the fixture

# The header timeout runs out first: a connection still taken for one waiting for its
# headers after the answer would be cut with a 408 at 0.3 s, not closed as idle at 0.6 s.
SHORT_HEADERS = Limits(header_timeout=0.3, keepalive_timeout=0.6)


async def test_a_leader_answer_leaves_its_connection_idle(served: Serve) -> None:  # noqa: F811
    s = await served(SHORT_HEADERS)
    reader, writer = await asyncio.open_unix_connection(s.path)
    for method in ("GET", "HEAD", "OPTIONS"):
        writer.write(f"{method} /leader HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert (await reader.readline()).startswith(b"HTTP/1.1 200")
        head = (await reader.readuntil(b"\r\n\r\n")).lower()
        length = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
        if method != "HEAD":
            assert b'"is_leader":true' in await reader.readexactly(length)
    rest = await reader.read()  # until the server closes the connection
    writer.close()
    assert b"408" not in rest
    assert s.unix.timed_out == {"header": 0, "idle": 1}
