"""The SQLite commit watcher (leaderd/backends/sqlite/wake.py) against merged write events,
and against writes beside the lease file.

inotify merges the write events read together, and a commit shows only after its fsync.
So one look may hear the write of a second commit while it sees the first one land: the
watcher must keep looking until the second shows, not go back to its idle wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from pathlib import Path

import pytest

from leaderd.backends.sqlite import wake


def _commit(db: Path, table: str) -> None:
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute(f"CREATE TABLE {table} (x)")
    writer.close()


async def test_a_commit_whose_write_was_heard_with_the_previous_one_still_wakes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only the fast look can end the second wait: the idle one is an hour away here.
    monkeypatch.setattr(wake, "_IDLE_POLL_INTERVAL", 3600.0)
    db = tmp_path / "leaderd.db"
    setup = sqlite3.connect(db, isolation_level=None)
    setup.execute("PRAGMA journal_mode=WAL")
    watcher = wake.CommitWatcher(str(db), 0.003)
    watcher.waiters = 1
    conn = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    written, armed = asyncio.Event(), asyncio.Event()
    looking = asyncio.create_task(watcher._poll_versions(conn, written, armed, fast=False))
    try:
        await armed.wait()
        first = watcher.changed
        # The first commit lands, and its write event comes with the second's, merged:
        # the watcher runs again only after both, so one look hears the write and sees it.
        _commit(db, "first")
        written.set()
        await asyncio.wait_for(first.wait(), 30)
        second = watcher.changed
        _commit(db, "second")  # heard already: no event of its own
        await asyncio.wait_for(second.wait(), 30)
    finally:
        looking.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await looking
        await watcher.close()
        conn.close()
        setup.close()


async def test_only_writes_to_the_lease_files_are_heard(tmp_path: Path) -> None:
    """A debug log beside the lease file wrote lines many times a second: every write was
    heard, and kept each watcher looking every millisecond (6% of a core per daemon)."""
    db = tmp_path / "leaderd.db"
    setup = sqlite3.connect(db, isolation_level=None)
    setup.execute("PRAGMA journal_mode=WAL")
    written = asyncio.Event()
    fd = wake._watch_writes(str(db), written)
    assert fd is not None, "inotify is unavailable here"
    asyncio.get_running_loop().remove_reader(fd)  # read by hand: the events are queued by then
    try:
        (tmp_path / "node-a.log").write_text("DEBUG a line\n")
        wake._drain(fd, written, wake._commit_files(str(db)))
        assert not written.is_set(), "a write to the log was heard as a commit"
        _commit(db, "lease")  # appends to leaderd.db-wal
        wake._drain(fd, written, wake._commit_files(str(db)))
        assert written.is_set(), "a commit was not heard"
    finally:
        os.close(fd)
        setup.close()
