"""What only the SQLite backend promises: URL forms, the file, its errors, boots, mounts
(waiters and writers across processes: test_sqlite_processes.py)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from leaderd.backends import (
    BackendFatal,
    Candidate,
    backend_from_url,
)
from leaderd.backends.sqlite.backend import SQLiteBackend
from leaderd.backends.sqlite.host import refuse_shared_filesystem
from tests.support.backend_calls import ask

from ..conftest import LONG_TTL, Opener

E = "default"
A = Candidate("node-a", "10.0.0.1:8080")
B = Candidate("node-b")
REPO = Path(__file__).resolve().parents[3]
COLUMNS = [
    "election",
    "holder",
    "instance",
    "address",
    "term",
    "acquired_at",
    "renewed_at",
    "expires_at",
    "boot_id",
    "expires_boottime",
    "version",
    "reserved_for",
    "reserved_until",
    "proof",
]


@pytest.fixture
async def db(tmp_path: Path) -> Path:
    return tmp_path / "leaderd.db"


def test_url_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    absolute = backend_from_url("sqlite:///var/lib/leaderd/leaderd.db")
    assert isinstance(absolute, SQLiteBackend) and absolute.path == "/var/lib/leaderd/leaderd.db"
    monkeypatch.chdir(tmp_path)
    relative = SQLiteBackend.from_url("sqlite:state/l.db?table=my_lease&busy_timeout_ms=250")
    assert relative.path == str(tmp_path / "state" / "l.db") and relative.table == "my_lease"
    assert relative.description == f"sqlite://{tmp_path}/state/l.db?table=my_lease"


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:",
        "sqlite://host/x.db",
        "sqlite:///x.db?bogus=1",
        "sqlite:///x.db?table=drop;table",
        "sqlite:///x.db?busy_timeout_ms=-1",
        "sqlite:///x.db?poll_interval_ms=fast",
    ],
)
def test_bad_urls_are_fatal(url: str) -> None:
    with pytest.raises(BackendFatal):
        SQLiteBackend.from_url(url)


async def test_the_file_is_in_wal_mode_with_the_documented_schema(db: Path, opened: Opener) -> None:
    backend = await opened(db, "?table=my_lease")
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert [r[1] for r in conn.execute("PRAGMA table_info(my_lease)")] == COLUMNS
        rows = conn.execute("SELECT election, holder, term FROM my_lease ORDER BY 1").fetchall()
    # Every election is visible, free, its terms seeded from the wall clock in milliseconds.
    assert [(election, holder) for election, holder, _ in rows] == [
        ("default", None),
        ("other", None),
    ]
    assert all(abs(term - time.time() * 1000) < 60_000 for _, _, term in rows)
    await backend.close()


async def test_a_missing_directory_is_fatal(tmp_path: Path, opened: Opener) -> None:
    path = tmp_path / "missing" / "leaderd.db"
    with pytest.raises(BackendFatal, match=str(path)):
        await opened(path)
    assert not path.parent.exists()  # leaderd creates the file, never its directory


async def test_a_path_under_a_regular_file_is_fatal(tmp_path: Path, opened: Opener) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(BackendFatal, match=str(tmp_path / "file")):
        await opened(tmp_path / "file" / "leaderd.db")


@pytest.fixture
def corrupt(db: Path) -> Path:
    db.write_bytes(b"this is no database " * 400)
    return db


async def test_a_corrupt_file_is_fatal_and_named(corrupt: Path, opened: Opener) -> None:
    db = corrupt
    with pytest.raises(BackendFatal, match=rf"{db}.*not a database"):
        await opened(db)


async def test_a_table_of_another_shape_is_fatal(db: Path, opened: Opener) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE leaderd_lease (x)")
    with pytest.raises(BackendFatal, match=str(db)):
        await opened(db)


@pytest.fixture
def immutable(db: Path) -> Iterator[Path]:
    """The database file with the immutable attribute: not even root may write it."""
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
    subprocess.run(["chattr", "+i", str(db)], check=True)
    try:
        yield db
    finally:
        subprocess.run(["chattr", "-i", str(db)], check=True)


async def test_a_read_only_file_is_fatal_even_for_root(immutable: Path, opened: Opener) -> None:
    with pytest.raises(BackendFatal, match=rf"{immutable}.*readonly"):
        await opened(immutable)


UNPRIVILEGED_OPEN = """
import asyncio, sys
from leaderd.backends import BackendError, backend_from_url
async def main():
    try:
        await backend_from_url(sys.argv[1]).open(["default"])
    except BackendError as exc:
        print(type(exc).__name__, exc)
    else:
        print("opened")
asyncio.run(main())
"""


def open_without_privileges(path: Path) -> str:
    """Open in a root process stripped of every capability: permission bits bind it."""
    command = ["setpriv", "--bounding-set=-all", "--inh-caps=-all", sys.executable]
    result = subprocess.run(
        [*command, "-c", UNPRIVILEGED_OPEN, f"sqlite://{path}"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


async def test_an_unwritable_directory_is_fatal(tmp_path: Path) -> None:
    directory = tmp_path / "read-only"
    directory.mkdir(mode=0o555)
    answer = open_without_privileges(directory / "leaderd.db")
    assert answer.startswith("BackendFatal") and str(directory) in answer, answer


async def test_an_unwritable_file_is_fatal(db: Path, opened: Opener) -> None:
    await (await opened(db)).close()
    os.chmod(db, 0o444)
    answer = open_without_privileges(db)
    assert answer.startswith("BackendFatal") and str(db) in answer, answer
    assert "readonly" in answer, answer


async def test_a_lease_from_another_boot_is_expired_but_never_free(
    db: Path, opened: Opener
) -> None:
    a, b = await opened(db), await opened(db)
    mine = await ask(a, E, A, LONG_TTL, timeout=5)
    with sqlite3.connect(db) as conn:  # as if the host rebooted since (or another kernel)
        conn.execute("UPDATE leaderd_lease SET boot_id = 'previous-boot', expires_boottime = 1e12")
    seen = await b.observe(E)
    assert (seen.holder, seen.term, seen.expired) == (A.node_id, mine.term, True)
    refused = await ask(b, E, B, LONG_TTL, timeout=5)
    assert not refused.held_by(B)  # not "instantly expired": the engine must watch it first
    again = await ask(a, E, A, LONG_TTL, timeout=5)
    assert again.held_by(A) and again.term == mine.term + 1  # a new term, not a renewal


MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:40 / /srv/shared rw,relatime shared:9 - nfs4 server:/export rw,vers=4.2
31 22 0:41 / /srv/fuse rw,nosuid shared:10 - fuse.sshfs host:/ rw
32 30 0:42 / /srv/shared/local rw shared:11 - tmpfs tmpfs rw
"""


@pytest.mark.parametrize(
    ("directory", "refused"),
    [
        ("/var/lib/leaderd", None),
        ("/srv/shared/leaderd", "nfs4"),
        ("/srv/fuse/x", "fuse.sshfs"),
        ("/srv/shared/local/leaderd", None),  # a local mount inside a network one
    ],
)
def test_network_and_fuse_filesystems_are_refused(
    tmp_path: Path, directory: str, refused: str | None
) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(MOUNTINFO)
    if refused is None:
        refuse_shared_filesystem(directory, str(mountinfo))
        return
    with pytest.raises(BackendFatal, match=f"on a {refused} filesystem.*one host"):
        refuse_shared_filesystem(directory, str(mountinfo))


def test_this_hosts_temporary_directory_is_local(tmp_path: Path) -> None:
    refuse_shared_filesystem(str(tmp_path))  # the real /proc/self/mountinfo
