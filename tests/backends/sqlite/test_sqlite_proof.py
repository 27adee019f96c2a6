"""sqlite:// crash failover: a holder's lease goes at once only on the kernel's proof of its
death (its holder lock freed on the inode the row names), else by the one-ttl rule.

Closing a backend closes its lock file, as the kernel does for a process that dies; a backend
left open is a holder that lives, however frozen. Real processes: tests/safety."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path

import pytest

from leaderd.backends import BackendFatal, Candidate
from leaderd.backends.sqlite.backend import SQLiteBackend
from leaderd.backends.sqlite.proof import SUFFIX
from tests.support.backend_calls import ask, release
from tests.support.holder_lock import break_holder_lock

from ..conftest import ELECTIONS, LONG_TTL, SHORT_TTL, Opener

E = "default"
DB = "leaderd.db"
A, B, C = Candidate("node-a"), Candidate("node-b"), Candidate("node-c")


def proof_of(path: Path) -> str | None:
    with sqlite3.connect(path) as conn:
        row = conn.execute("SELECT proof FROM leaderd_lease WHERE election = ?", (E,))
        proof: str | None = row.fetchone()[0]
        return proof


def history(path: Path) -> list[tuple[int, str, str | None]]:
    with sqlite3.connect(path) as conn:
        sql = "SELECT term, holder, end_reason FROM leaderd_lease_history ORDER BY term"
        return [tuple(r) for r in conn.execute(sql)]  # type: ignore[misc]


async def test_a_dead_holders_live_lease_is_taken_at_once_with_the_next_term(
    opened: Opener, tmp_path: Path
) -> None:
    a, b = await opened(tmp_path / DB), await opened(tmp_path / DB)
    held = await ask(a, E, A, LONG_TTL, timeout=10)
    assert proof_of(tmp_path / "leaderd.db") == f"{A.instance} {_inode(tmp_path)}"
    # Alive (or frozen: nothing runs in a between these calls): its lock stands.
    assert not (await ask(b, E, B, LONG_TTL, timeout=10)).held_by(B)
    await a.close()  # the kernel closes a dead process's files
    taken = await ask(b, E, B, LONG_TTL, timeout=10)  # takeover="": no ttl rule
    assert taken.held_by(B) and taken.term == held.term + 1
    assert history(tmp_path / "leaderd.db")[-2:] == [
        (held.term, "node-a", "holder died"),
        (held.term + 1, "node-b", None),
    ]


async def test_a_standby_waiting_for_a_change_wakes_when_the_holder_dies(
    opened: Opener, tmp_path: Path
) -> None:
    a, b = await opened(tmp_path / DB), await opened(tmp_path / DB)
    await ask(a, E, A, LONG_TTL, timeout=10)
    await ask(b, E, B, LONG_TTL, timeout=10)  # b sees a's lease and its proof
    waiting = asyncio.create_task(b.wait_for_change(E, LONG_TTL))
    await asyncio.sleep(0.2)
    assert not waiting.done()  # a lives: no commit, no lapse, no wake
    await a.close()
    # No commit follows a's death: only its freed lock can end the wait before LONG_TTL.
    await asyncio.wait_for(waiting, LONG_TTL / 2)
    assert (await ask(b, E, B, LONG_TTL, timeout=10)).held_by(B)


async def test_a_lease_taken_by_the_ttl_rule_without_the_lock_gives_no_shortcut(
    opened: Opener, tmp_path: Path
) -> None:
    a, b, c = await opened(tmp_path / DB), await opened(tmp_path / DB), await opened(tmp_path / DB)
    first = await ask(a, E, A, SHORT_TTL, timeout=10)
    await asyncio.sleep(SHORT_TTL * 1.5)  # a is frozen past its lease, its lock still held
    taken = await ask(b, E, B, LONG_TTL, timeout=10, takeover=first.version)
    assert taken.held_by(B) and proof_of(tmp_path / "leaderd.db") is None
    await a.close()  # a dies now: its lock is free, but b never recorded it
    assert not (await ask(c, E, C, LONG_TTL, timeout=10)).held_by(C)
    # b's next renewal takes the free lock and records its own proof.
    await ask(b, E, B, LONG_TTL, timeout=10)
    assert proof_of(tmp_path / "leaderd.db") == f"{B.instance} {_inode(tmp_path)}"
    await b.close()
    assert (await ask(c, E, C, LONG_TTL, timeout=10)).held_by(C)


@pytest.mark.parametrize("how", ["replaced", "deleted"])
async def test_a_lock_file_replaced_or_deleted_under_a_live_holder_proves_nothing(
    opened: Opener, tmp_path: Path, how: str
) -> None:
    a = await opened(tmp_path / DB)
    await ask(a, E, A, LONG_TTL, timeout=10)
    break_holder_lock(tmp_path / "leaderd.db", how)
    c = await opened(tmp_path / DB)  # opens the new file: nobody holds a lock on it
    assert not (await ask(c, E, C, LONG_TTL, timeout=10)).held_by(C)
    await a.close()  # even once a is gone: its proof names an inode c cannot lock
    assert not (await ask(c, E, C, LONG_TTL, timeout=10)).held_by(C)


@pytest.mark.parametrize("why", ["supervises a command", "crash_failover=ttl"])
async def test_a_daemon_on_the_ttl_rule_only_records_no_proof(
    opened: Opener, tmp_path: Path, why: str
) -> None:
    if why == "supervises a command":
        a = await opened(tmp_path / DB)
        a.ttl_rule_only()  # what the daemon does for `run -- COMMAND`
    else:
        a = SQLiteBackend.from_url(f"sqlite://{tmp_path}/leaderd.db?crash_failover=ttl")
        await a.open(ELECTIONS)
    b = await opened(tmp_path / DB)
    await ask(a, E, A, LONG_TTL, timeout=10)
    assert proof_of(tmp_path / "leaderd.db") is None
    await a.close()
    assert not (await ask(b, E, B, LONG_TTL, timeout=10)).held_by(B)


def test_crash_failover_is_proof_or_ttl(tmp_path: Path) -> None:
    with pytest.raises(BackendFatal, match="crash_failover must be proof or ttl"):
        SQLiteBackend.from_url(f"sqlite://{tmp_path}/leaderd.db?crash_failover=fast")


async def test_a_released_lease_carries_no_proof_and_frees_the_lock(
    opened: Opener, tmp_path: Path
) -> None:
    a, b, c = await opened(tmp_path / DB), await opened(tmp_path / DB), await opened(tmp_path / DB)
    held = await ask(a, E, A, LONG_TTL, timeout=10)
    await release(a, E, A, held.term)
    assert proof_of(tmp_path / "leaderd.db") is None
    assert (await ask(b, E, B, LONG_TTL, timeout=10)).held_by(B)
    # a lives on, but let go of the lock: b could record its proof, and its death shows.
    assert proof_of(tmp_path / "leaderd.db") == f"{B.instance} {_inode(tmp_path)}"
    await b.close()
    assert (await ask(c, E, C, LONG_TTL, timeout=10)).held_by(C)


async def test_the_lock_file_is_private_to_its_owner(opened: Opener, tmp_path: Path) -> None:
    await opened(tmp_path / DB)
    assert os.stat(f"{tmp_path}/leaderd.db{SUFFIX}").st_mode & 0o077 == 0


def _inode(tmp_path: Path) -> str:
    st = os.stat(f"{tmp_path}/leaderd.db{SUFFIX}")
    return f"{st.st_dev} {st.st_ino}"


async def test_a_proof_written_under_another_boot_is_never_used(
    opened: Opener, tmp_path: Path
) -> None:
    a, b = await opened(tmp_path / DB), await opened(tmp_path / DB)
    await ask(a, E, A, LONG_TTL, timeout=10)
    await a.close()  # its lock is free; but the row now says another kernel wrote it
    with sqlite3.connect(tmp_path / DB) as conn:
        conn.execute("UPDATE leaderd_lease SET boot_id = 'another-kernel' WHERE election = ?", (E,))
    # Another kernel's locks are not this kernel's: only the one-ttl rule may take it.
    assert not (await ask(b, E, B, LONG_TTL, timeout=10)).held_by(B)
