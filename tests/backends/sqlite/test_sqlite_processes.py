"""SQLite's waiters and writers across processes: a locked file, a lapse or a release that
wakes a waiter, renewals that do not, and processes contending on one file."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from leaderd.backends import (
    BackendUnavailable,
    Candidate,
)
from leaderd.backends.sqlite import wake as sqlite_wake
from tests.support.backend_calls import ask

from ..conftest import LONG_TTL, SHORT_TTL, Opener

E = "default"
A = Candidate("node-a", "10.0.0.1:8080")
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
async def db(tmp_path: Path) -> Path:
    return tmp_path / "leaderd.db"


async def test_a_locked_file_makes_requests_give_up_in_time_and_recover(
    db: Path, opened: Opener
) -> None:
    backend = await opened(db)
    locker = sqlite3.connect(db, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match=str(db)):
        await ask(backend, E, A, LONG_TTL, timeout=0.3)
    assert time.monotonic() - started < 2.0
    assert (await backend.observe(E)).holder is None  # WAL: reads go on during a write
    locker.execute("ROLLBACK")
    locker.execute("BEGIN IMMEDIATE")  # the backend does not keep a transaction open
    locker.execute("ROLLBACK")
    lease = await ask(backend, E, A, LONG_TTL, timeout=5)
    assert lease.held_by(A)
    await backend.close()


async def test_a_waiter_wakes_when_the_lease_it_saw_lapses(db: Path, opened: Opener) -> None:
    a, b = await opened(db), await opened(db)
    await ask(a, E, A, SHORT_TTL, timeout=5)
    await b.observe(E)
    started = time.monotonic()
    await b.wait_for_change(E, 5.0)
    assert SHORT_TTL * 0.7 < time.monotonic() - started < 2.5


@pytest.mark.parametrize("inotify", [True, False], ids=["inotify", "polling"])
async def test_a_release_in_another_process_wakes_a_waiter_promptly(
    db: Path, inotify: bool, monkeypatch: pytest.MonkeyPatch, opened: Opener
) -> None:
    if inotify:  # the slow safety-net poll alone would be too late: only inotify can pass
        monkeypatch.setattr(sqlite_wake, "_IDLE_POLL_INTERVAL", 30.0)
    else:  # as where inotify is unavailable: data_version polled every few ms
        monkeypatch.setattr(sqlite_wake, "_watch_writes", lambda directory, written: None)
    waiter = await opened(db)
    holder = await asyncio.create_subprocess_exec(
        *(sys.executable, "-c", HOLDER, f"sqlite://{db}"),
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert holder.stdin is not None and holder.stdout is not None
    term = int(await holder.stdout.readline())
    assert (await waiter.observe(E)).term == term
    # Only a wake-up can end this wait before the test's: its own timeout is an hour, and
    # the safety-net poll (30 s here) is past the test's 10 s too.
    waiting = asyncio.create_task(waiter.wait_for_change(E, 3600))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    holder.stdin.write(b"release\n")
    await holder.stdout.readline()  # released
    await asyncio.wait_for(waiting, 10)
    assert await holder.wait() == 0


@pytest.mark.parametrize("slashes", ["/", "//"], ids=["path", "path-from-sqlite:////"])
async def test_a_commit_right_after_arming_wakes_the_waiters(
    db: Path, slashes: str, opened: Opener
) -> None:
    """A waiter reads the lease after arming: a commit at once after (here before the loop
    turns again) must wake it, from a baseline taken before. "sqlite:////abs" gives a path
    that begins with "//"."""
    await opened(db)
    watcher = sqlite_wake.CommitWatcher(slashes + str(db).lstrip("/"), 0.003)
    watcher.waiters = 1
    changed = watcher.changed
    try:
        await watcher.arm()
        writer = sqlite3.connect(db, isolation_level=None)
        writer.execute("CREATE TABLE a_commit (x)")
        writer.close()
        await asyncio.wait_for(changed.wait(), 10)
    finally:
        await watcher.close()


async def test_close_releases_a_waiter_whose_watch_never_ran(db: Path, opened: Opener) -> None:
    await opened(db)
    watcher = sqlite_wake.CommitWatcher(str(db), 0.003)
    watcher.waiters = 1
    arming = asyncio.create_task(watcher.arm())
    await asyncio.sleep(0)  # arm() started the watch's task, which has not run yet
    await watcher.close()  # cancelled before its first step: its own cleanup never runs
    await asyncio.wait_for(arming, 10)


HOLDER = """
import asyncio, sys, time
from leaderd.backends import Candidate, backend_from_url
from leaderd.backends.asks import Ask, Release
async def main(url):
    backend = backend_from_url(url)
    await backend.open(["default"])
    me = Candidate("holder")  # one process: one instance
    lease = await backend.acquire_or_renew(Ask("default", me, 60.0, 5))
    print(lease.term, flush=True)
    sys.stdin.readline()
    released = time.monotonic()
    await backend.release(Release("default", me, lease.term))
    print(released, flush=True)
    await backend.close()
asyncio.run(main(sys.argv[1]))
"""


async def test_renewals_do_not_wake_waiters(db: Path, opened: Opener) -> None:
    a, b = await opened(db), await opened(db)
    await ask(a, E, A, LONG_TTL, timeout=5)
    await b.observe(E)
    waiter = asyncio.create_task(b.wait_for_change(E, 0.8))
    for _ in range(10):
        await asyncio.sleep(0.05)
        assert (await ask(a, E, A, LONG_TTL, timeout=5)).held_by(A)
        assert not waiter.done()
    await waiter


async def test_close_wakes_waiters(db: Path, opened: Opener) -> None:
    backend = await opened(db)
    await backend.observe(E)
    waiter = asyncio.create_task(backend.wait_for_change(E, 30.0))
    await asyncio.sleep(0.1)
    await backend.close()
    await asyncio.wait_for(waiter, 2.0)


CONTENDER = """
import asyncio, json, random, sys, time
from leaderd.backends import Candidate, backend_from_url
from leaderd.backends.asks import Ask, Release
async def main(url, node):
    backend = backend_from_url(url)
    await backend.open(["default", "other"])
    me = Candidate(node)
    print("ready", flush=True)
    sys.stdin.readline()  # every contender starts at once
    first = await backend.acquire_or_renew(Ask("default", me, 60.0, 20))
    held, end, takeover = [], time.monotonic() + 2.0, ""
    while time.monotonic() < end:  # then churn on "other": short leases, some released
        sent = time.monotonic()
        lease = await backend.acquire_or_renew(Ask("other", me, 0.1, 2, takeover=takeover))
        takeover = lease.version if lease.expired else ""  # as the engine would, one ttl later
        if lease.held_by(me):  # it leads from the answer until sent + ttl, or until release
            held.append([lease.term, time.monotonic(), sent + 0.1])
            if random.random() < 0.3:
                for span in held:  # steps down first: ends every span of this term
                    if span[0] == lease.term:
                        span[2] = min(span[2], time.monotonic())
                await backend.release(Release("other", me, lease.term))
        await asyncio.sleep(random.choice([0.0, 0.0, 0.12]) + random.uniform(0, 0.02))  # lapses
    closing = time.monotonic()  # close() drops the holder lock, as death does: no more leading
    for span in held:
        span[2] = min(span[2], closing)
    await backend.close()
    print(json.dumps({"holder": first.holder, "term": first.term, "held": held}))
asyncio.run(main(*sys.argv[1:]))
"""


async def test_processes_contending_on_one_file_never_overlap(db: Path) -> None:
    nodes = [f"proc-{i}" for i in range(6)]
    procs = [
        await asyncio.create_subprocess_exec(
            *(sys.executable, "-c", CONTENDER, f"sqlite://{db}", node),
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        for node in nodes
    ]
    for proc in procs:
        assert proc.stdout is not None and await proc.stdout.readline() == b"ready\n"
    outputs = []
    for proc in procs:
        proc.stdin.write(b"go\n")  # type: ignore[union-attr]
    for proc in procs:
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0
        outputs.append(json.loads(out))
    # Round one: all at once, long ttl: exactly one holder, the same answer for everyone.
    assert len({(o["holder"], o["term"]) for o in outputs}) == 1
    assert outputs[0]["holder"] in nodes and outputs[0]["term"] > 1_000_000_000_000  # seeded
    # The churn: one holder per term, and no two nodes ever believed they led at once.
    spans = [(n, *span) for n, o in zip(nodes, outputs, strict=True) for span in o["held"]]
    spans = [span for span in spans if span[2] < span[3]]  # an answer after sent + ttl: nothing
    holders_of: dict[int, set[str]] = {}
    for node, term, _, _ in spans:
        holders_of.setdefault(term, set()).add(node)
    assert len(holders_of) > 3 and all(len(h) == 1 for h in holders_of.values()), holders_of
    for one, two in itertools.combinations(spans, 2):
        assert one[0] == two[0] or one[3] <= two[2] or two[3] <= one[2], (one, two)
