"""A transition hook's failure is recorded in the history of the term it is about (docs/run.md,
"Transition hooks"), with real daemons: the release of the term carries it, so every node's
GET /history names the hook and how it failed."""

from __future__ import annotations

import shutil
import signal
from collections.abc import Iterator

import pytest

from tests.support.daemons import Daemon, history, metric, short_tempdir, wait_for

pytestmark = pytest.mark.slow

TTL = 2.0
FAILED = 'leaderd_hook_runs_total{election="default",hook="%s",result="%s"}'


@pytest.fixture
def workdir() -> Iterator[str]:
    path = short_tempdir("ld-hh-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_failed_elected_hook_is_named_in_the_terms_history(workdir: str) -> None:
    backend = f"sqlite://{workdir}/lease.db"
    a = Daemon("node-a", backend, workdir=workdir, ttl=TTL,
               extra_args=("--on-elected", "sh -c 'exit 3'")).start()  # fmt: skip
    a.wait_ready()
    wait_for(lambda: metric(a, FAILED % ("on_elected", "failed")) == 1, timeout=10,
             what="the elected hook to fail")  # fmt: skip
    term = a.get("/leader")[1]["term"]
    b = Daemon("node-b", backend, workdir=workdir, ttl=TTL).start()
    b.wait_ready()
    a.signal(signal.SIGTERM)
    assert a.wait() == 0
    told = (term, "node-a", "released; on_elected hook failed with status 3")
    wait_for(lambda: told in history(b, 5), timeout=10, what=f"{told} in node-b's history")
    b.stop()


def test_a_demote_hook_that_times_out_is_named_in_the_terms_history(workdir: str) -> None:
    backend = f"sqlite://{workdir}/lease.db"
    hooks = ("--on-demoted", "sleep 30", "--hook-timeout", "0.5")
    a = Daemon("node-a", backend, workdir=workdir, ttl=TTL, extra_args=hooks).start()
    a.wait_ready()
    wait_for(a.is_leader, timeout=10, what="node-a to lead")
    term = a.get("/leader")[1]["term"]
    assert a.post("/resign?cooldown=30")[0] == 200
    told = (term, "node-a", "resigned; on_demoted hook timed out after 0.5s: killed")
    wait_for(lambda: told in history(a, 5), timeout=10, what=f"{told} in node-a's history")
    assert metric(a, FAILED % ("on_demoted", "timeout")) == 1
    a.stop()
