#!/usr/bin/env python3
"""Start work when this node becomes leader and stop it when it stops leading.

Standard library only. Follows leaderd's /watch long poll over the Unix socket and
passes the term on as a fencing token, so a stale leader's writes can be refused.

    python3 follow_leader.py [--socket /run/leaderd/leaderd.sock] [--election default]
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import threading
import time


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def watch(sock: str, election: str, revision: int, timeout: int = 30) -> dict:
    """One long poll: the status once its revision differs from ours, or after timeout."""
    query = f"?timeout={timeout}&revision={revision}"
    conn = UnixHTTPConnection(sock, timeout + 5)
    try:
        conn.request("GET", f"/watch/{election}{query}")
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


class Worker:
    """The work that must run on one node only; it carries the term it was started with."""

    def __init__(self, term: int) -> None:
        self.term = term
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stopped.wait(1.0):
            # Real work passes the term to what it writes to, e.g.
            # UPDATE jobs SET ... WHERE fencing_term <= %(term)s
            print(f"working with fencing term {self.term}", flush=True)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", default="/run/leaderd/leaderd.sock")
    parser.add_argument("--election", default="default")
    args = parser.parse_args()
    worker: Worker | None = None
    # Revisions start at 1, so asking with 0 answers the current state at once.
    revision = 0
    while True:
        try:
            status = watch(args.socket, args.election, revision)
        except OSError as exc:
            print(f"leaderd unreachable ({exc}); not leading", flush=True)
            # Revision 0 again: a daemon that (re)starts answers the next poll at once.
            status = {"is_leader": False, "role": "unknown", "term": 0, "revision": 0}
            time.sleep(1)
        revision = status["revision"]
        if status["is_leader"] and worker is None:
            print(f"became leader, term {status['term']}: starting work", flush=True)
            worker = Worker(status["term"])
        elif not status["is_leader"] and worker is not None:
            print(f"no longer leader ({status['role']}): stopping work", flush=True)
            worker.stop()
            worker = None
        if status["role"] == "stopped":
            print("leaderd stopped", flush=True)
            return


if __name__ == "__main__":
    main()
