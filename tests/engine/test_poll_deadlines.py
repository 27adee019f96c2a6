"""The long polls' timeouts share one timer (leaderd/election/poll_deadlines.py): each poll
still times out at its own deadline, whichever order they came in, and a publish or a poll
that left early takes its deadline with it."""

from __future__ import annotations

import asyncio

from leaderd.election.poll_deadlines import PollDeadlines

GUARD = 30.0  # only against a hang: no figure of latency is judged here


def futures(n: int) -> list[asyncio.Future[bool]]:
    loop = asyncio.get_running_loop()
    return [loop.create_future() for _ in range(n)]


async def test_a_later_poll_with_an_earlier_deadline_times_out_first() -> None:
    deadlines = PollDeadlines()
    slow, quick = futures(2)
    deadlines.add(slow, 60.0)
    deadlines.add(quick, 0.05)  # the timer must move to it
    done, _ = await asyncio.wait({quick}, timeout=GUARD)
    assert quick in done and quick.result() is False
    assert not slow.done()
    deadlines.clear()


async def test_each_poll_times_out_at_its_own_deadline_in_order() -> None:
    deadlines = PollDeadlines()
    polls = futures(3)
    for poll, timeout in zip(polls, (0.15, 0.0, 0.05), strict=True):
        deadlines.add(poll, timeout)
    order: list[int] = []
    for i, poll in enumerate(polls):
        poll.add_done_callback(lambda _, i=i: order.append(i))
    await asyncio.wait(polls, timeout=GUARD)
    assert order == [1, 2, 0]
    assert all(poll.result() is False for poll in polls)


async def test_clear_drops_every_deadline() -> None:
    deadlines = PollDeadlines()
    (poll,) = futures(1)
    deadlines.add(poll, 0.01)
    deadlines.clear()  # a publish answered it
    await asyncio.sleep(0.05)
    assert not poll.done()


async def test_polls_that_left_are_dropped_and_the_rest_still_time_out() -> None:
    deadlines = PollDeadlines()
    left = futures(3000)
    for poll in left:
        deadlines.add(poll, 60.0)
        poll.cancel()  # its client went away
    (waiting,) = futures(1)
    deadlines.add(waiting, 0.01)
    assert len(deadlines._heap) < 3001  # compacted: the polls that left are gone
    done, _ = await asyncio.wait({waiting}, timeout=GUARD)
    assert waiting in done and waiting.result() is False
    deadlines.clear()
