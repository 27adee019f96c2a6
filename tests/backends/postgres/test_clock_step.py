"""Issue 10, path 6: the PostgreSQL server's clock steps forward under running daemons.

The server runs under libfaketime with an offset file (FAKETIME_TIMESTAMP_FILE), so its
wall clock — now(), which judges expiry — jumps by an hour while it runs; the daemons'
clocks are untouched. Every live lease is then expired on the server, but a standby may
take over only a version it has watched unchanged for one ttl on its own clock
(docs/algorithm.md): a renewing leader keeps its lease, and no instant has two leaders.
"""

from __future__ import annotations

import shutil
import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from leaderd.backends.postgres.advisory import advisory_key
from tests.backends.postgres.helpers import unique
from tests.support.daemons import Daemon, leaders, short_tempdir, wait_for
from tests.support.pgserver import FakeTimeServer

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

TTL = 2.0
STEP = 3600  # seconds the server's clock jumps forward
# Ends the session holding the election's advisory lock, only while another one waits for it.
END_WHILE_WAITED = """
SELECT count(pg_terminate_backend(h.pid)) FROM pg_locks h
WHERE h.locktype = 'advisory' AND h.granted AND h.objsubid = 1
  AND ((h.classid::int8 << 32) | h.objid::int8) = {key}
  AND EXISTS (SELECT 1 FROM pg_locks w WHERE w.locktype = 'advisory' AND NOT w.granted
              AND w.objsubid = 1 AND w.classid = h.classid AND w.objid = h.objid)
"""


def is_leader(daemon: Daemon, timeout: float = 0.05) -> bool | None:
    """HEAD /leader over the daemon's socket, fast enough to sample every few ms; None
    when it does not answer in time (stopped)."""
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(timeout)
            s.connect(daemon.socket)
            s.sendall(b"HEAD /leader HTTP/1.1\r\nHost: leaderd\r\nConnection: close\r\n\r\n")
            status = s.recv(64).split(b" ", 2)[1]
    except (OSError, IndexError):
        return None
    return status == b"200"


class Sampler(threading.Thread):
    """Asks both daemons "are you the leader?" back to back, over and over."""

    def __init__(self, a: Daemon, b: Daemon) -> None:
        super().__init__(daemon=True)
        self.a, self.b = a, b
        self.samples: list[tuple[float, bool | None, bool | None]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.samples.append((time.monotonic(), is_leader(self.a), is_leader(self.b)))
            time.sleep(0.002)

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def overlaps(self) -> list[float]:
        return [t for t, a, b in self.samples if a and b]


@pytest.fixture
def pair(
    fake_time_server: FakeTimeServer, request: pytest.FixtureRequest
) -> Iterator[list[Daemon]]:
    fake_time_server.step(0)
    url = fake_time_server.dsn(scheme=request.param, table=unique("step"))
    workdir = short_tempdir()
    daemons = [Daemon(f"node-{i}", url, workdir=workdir, ttl=TTL).start() for i in range(2)]
    try:
        for d in daemons:
            d.wait_ready()
        yield daemons
    finally:
        for d in daemons:
            if d.alive():
                d.signal(signal.SIGCONT)
            d.kill()
        fake_time_server.step(0)
        shutil.rmtree(workdir, ignore_errors=True)


def leader_and_standby(daemons: list[Daemon]) -> tuple[Daemon, Daemon]:
    found = wait_for(lambda: leaders(daemons), timeout=TTL + 3, what="a leader")
    assert len(found) == 1
    leader = found[0]
    return leader, next(d for d in daemons if d is not leader)


def stepped(pg: FakeTimeServer) -> None:
    before = pg.server_now()
    pg.step(STEP)
    assert pg.server_now() - before > STEP - 5, "the server's clock did not step"


@pytest.mark.parametrize("pair", ["postgresql"], indirect=True)
def test_a_server_clock_step_does_not_cut_a_renewing_leaders_lease(
    fake_time_server: FakeTimeServer, pair: list[Daemon]
) -> None:
    leader, standby = leader_and_standby(pair)
    sampler = Sampler(*pair)
    sampler.start()
    try:
        time.sleep(1.0)
        stepped(fake_time_server)  # every expires_at is an hour in the past now
        time.sleep(3 * TTL)  # the standby has watched the leader's version for a ttl, twice
    finally:
        sampler.stop()
    assert not sampler.overlaps(), f"two leaders at {len(sampler.overlaps())} samples"
    standby_led = [sample for sample in sampler.samples if sample[1 + pair.index(standby)]]
    assert not standby_led, "the standby took over a lease its holder kept renewing"
    assert leaders(pair) == [leader]
    print(f"\nserver clock +{STEP}s: {len(sampler.samples)} samples, one leader throughout")


@pytest.mark.parametrize("pair", ["postgresql+advisory"], indirect=True)
def test_a_server_clock_step_and_an_ended_session_never_make_two_leaders(
    fake_time_server: FakeTimeServer, pair: list[Daemon]
) -> None:
    """takeover=wait: the server ends the leader's lock session while the leader is paused,
    after its clock stepped forward. The standby is granted the lock at once, and the
    row's lease is expired on the server; it claims only after watching that row's version
    for one ttl, so the paused leader, resumed, has stepped down by then."""
    leader, standby = leader_and_standby(pair)
    sampler = Sampler(*pair)
    sampler.start()
    try:
        time.sleep(1.0)
        # Paused before the step: a renewal after it would make the row live on the server's
        # new clock, and the standby, rightly, would give the lock back to the leader.
        leader.signal(signal.SIGSTOP)
        stepped(fake_time_server)
        # Ended in the very statement that sees the standby waiting in the lock's queue: a
        # standby between two rounds (a busy host) would let the resumed leader win the lock
        # back, and the takeover would go untested. On a host so busy that the standby is
        # hardly ever queued, the server ends the paused session itself (idle_session_timeout,
        # at least one ttl after its last request): the same takeover, once the standby leads.
        ended = END_WHILE_WAITED.format(key=advisory_key("default"))
        wait_for(lambda: fake_time_server.psql(ended) == "1" or standby.is_leader(),
                 timeout=5 * TTL, interval=0.005, what="the leader's session to end")  # fmt: skip
        time.sleep(0.3)
        leader.signal(signal.SIGCONT)  # its first answers come before it hears of the end
        # The lock comes at once, the claim one ttl later (takeover=wait); room for a busy host.
        wait_for(lambda: leaders(pair) == [standby], timeout=3 * TTL, what="the standby")
        time.sleep(0.5)
    finally:
        leader.signal(signal.SIGCONT)
        sampler.stop()
    assert not sampler.overlaps(), f"two leaders at {len(sampler.overlaps())} samples"
    assert any(a for _, a, _ in sampler.samples) and any(b for _, _, b in sampler.samples)
    print(f"\nserver clock +{STEP}s, session ended: {len(sampler.samples)} samples, no overlap")
