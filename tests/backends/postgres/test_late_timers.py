"""The server's timers run late: what a backward step of its clock does to lock_timeout.

PostgreSQL arms every timeout (lock_timeout among them) on its wall clock. When SIGALRM
arrives, the handler compares GetCurrentTimestamp() with the deadline; if the clock went
back meanwhile, it re-arms the alarm for the difference. So a server whose clock steps
back by ten minutes answers a 200 ms lock wait ten minutes late.

libfaketime shows the handler exactly that: it fakes the clock everywhere except inside
its own epoll_wait wrapper, where a backend waiting for a lock sleeps. The handler
interrupts that wait, so it reads a clock 600 s behind the one that armed the timer
(strace: ``setitimer(ITIMER_REAL, {it_value={tv_sec=599, ...}})``). The chaos harness's
clock_step fault did this to every advisory standby: each lock wait ran into the request's
own timeout, and the standbys flapped between "follower" and "unknown" (tests/chaos).
"""

from __future__ import annotations

import pytest

from leaderd.backends import Candidate
from tests.backends.postgres.helpers import (
    admin,
    lock_queue_empties,
    opened,
    standby_session_pids,
    unique,
)
from tests.support.backend_calls import ask
from tests.support.pgserver import FakeTimeServer

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

A = Candidate("node-a", "10.0.0.1:80")
B = Candidate("node-b", "10.0.0.2:80")
STEP = 600


def late_timers(pg: FakeTimeServer, app: str) -> str:
    """An advisory URL on a server whose lock_timeout now fires about STEP seconds late."""
    pg.step(STEP)
    table = unique("late")
    return pg.dsn(scheme="postgresql+advisory", table=table, application_name=app)


async def test_a_standby_names_the_leader_every_round_when_lock_timeout_fires_late(
    fake_time_server: FakeTimeServer,
) -> None:
    """A standby's round blocks in the lock for ``wait`` (0.2 s) and must answer within its
    request's timeout, not wait out a lock_timeout that fires STEP seconds late; before, every
    round timed out waiting for the lock_timeout's answer (the chaos harness's standbys
    flapped). The timeout is 2 s: STEP seconds apart from the failure, and far enough from
    the wait that a loaded CI worker does not fail it (0.4 s did, once)."""
    app, e = unique("leaderd-late"), unique()
    u = late_timers(fake_time_server, app)
    async with opened(u, e) as a, opened(u, e) as b, admin(fake_time_server) as other:
        await ask(a, e, A, ttl=1.5, timeout=5)
        # B's session opens (connect, plan, prepare) in a round of its own, with time for a
        # loaded machine: what is timed below is a round on a kept session.
        await ask(b, e, B, ttl=1.5, timeout=5, wait=0.2)
        pids = await standby_session_pids(b, e, B, A.node_id, ttl=1.5, timeout=2.0)
        # The LISTEN connection cancels each wait: the session is kept, no process per round.
        assert len(pids) == 1, f"the standby's session changed: server pids {sorted(pids)}"
        # The waits given up on leave the lock queue: none waits out the late timer.
        assert await lock_queue_empties(other, app)
