#!/usr/bin/env python3
"""A write that the SQLite lease file itself fences (docs/fencing.md).

Standard library only. The application's own database attaches leaderd's lease file; one
transaction takes the write lock of both files (BEGIN IMMEDIATE), checks that the lease
still has this term, unexpired, and writes. While it holds the lease file's write lock no
release, renewal or takeover can commit, so a write the check let through lands before
any hand-over.

    python3 sqlite_fence.py --lease-file /var/lib/leaderd/leaderd.db --app-db app.db \\
        [--socket /run/leaderd/leaderd.sock] [--election default] NOTE

It asks leaderd for the term (GET /leader), appends NOTE to the table fenced_log of
app.db, and exits 0; 1 when the lease file refused the term (another node leads now, or
the lease lapsed).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import socket
import sqlite3
import sys
import time
from collections.abc import Iterator

BOOT_ID = "/proc/sys/kernel/random/boot_id"
# Live: held with this term, written on this boot, not lapsed on CLOCK_BOOTTIME. leaderd
# keeps a lease's expiry on CLOCK_BOOTTIME of the boot that wrote it (docs/sqlite.md).
GUARD = """
SELECT EXISTS (SELECT 1 FROM lease.leaderd_lease
               WHERE election = :election AND holder IS NOT NULL AND term = :term
                 AND boot_id = :boot_id AND expires_boottime > :now)"""


class StaleTerm(Exception):
    """The lease file no longer has this term, live: another node leads, or none does."""


def connect(app_db: str, lease_file: str) -> sqlite3.Connection:
    """The application's database with the lease file attached as ``lease``."""
    conn = sqlite3.connect(app_db, isolation_level=None, timeout=5.0)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("ATTACH DATABASE ? AS lease", (lease_file,))
    conn.execute("CREATE TABLE IF NOT EXISTS fenced_log (term INTEGER NOT NULL, note TEXT)")
    return conn


@contextlib.contextmanager
def fenced(conn: sqlite3.Connection, election: str, term: int) -> Iterator[sqlite3.Connection]:
    """A transaction that commits only if ``term`` leads ``election``; raises StaleTerm
    (rolled back) otherwise. Keep it short: leaderd's renewals wait for it."""
    conn.execute("BEGIN IMMEDIATE")  # the write lock of both files, the lease file's too
    try:
        # The clock is read under the lock: no lease can change after this reading.
        now = time.clock_gettime(time.CLOCK_BOOTTIME)
        with open(BOOT_ID) as f:
            boot_id = f.read().strip()
        args = {"election": election, "term": term, "boot_id": boot_id, "now": now}
        if not conn.execute(GUARD, args).fetchone()[0]:
            raise StaleTerm(f"election {election} is not led with term {term}")
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def leader_term(sock: str, election: str) -> int:
    """This node's term from GET /leader, or 0 when it does not lead."""
    conn = http.client.HTTPConnection("localhost", timeout=5)
    conn.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.sock.connect(sock)
    try:
        conn.request("GET", f"/leader/{election}")
        answer = conn.getresponse()
        status = json.loads(answer.read())
        return int(status["term"]) if answer.status == 200 else 0
    finally:
        conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lease-file", required=True)
    parser.add_argument("--app-db", required=True)
    parser.add_argument("--socket", default="/run/leaderd/leaderd.sock")
    parser.add_argument("--election", default="default")
    parser.add_argument("--term", type=int, help="the term to write with (default: ask leaderd)")
    parser.add_argument("note")
    args = parser.parse_args()
    term = args.term if args.term is not None else leader_term(args.socket, args.election)
    conn = connect(args.app_db, args.lease_file)
    try:
        with fenced(conn, args.election, term):
            conn.execute("INSERT INTO fenced_log (term, note) VALUES (?, ?)", (term, args.note))
    except StaleTerm as refused:
        print(f"refused: {refused}", file=sys.stderr)
        return 1
    print(f"written with term {term}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
