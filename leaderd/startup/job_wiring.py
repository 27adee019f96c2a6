"""`run --once-per`'s wiring: its job store, its runner, its metrics and its GET /jobs view."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from ..api.jobs import JobMetrics, job_body
from ..backends.base import BackendError, BackendUnavailable
from ..backends.jobs import JobStore, job_store_from_url
from ..supervision.once_per import OncePer

if TYPE_CHECKING:
    from ..api.metrics import Metrics
    from ..election.engine import Election
    from ..election.node import Node
    from .config import Config
    from .daemon import Job

log = logging.getLogger("leaderd")


async def open_runner(
    config: Config,
    election: Election,
    job: Job,
    socket_path: str,
    metrics: Metrics,
    node: Node,
    teardown: contextlib.AsyncExitStack,
) -> OncePer | None:
    """The runner on its opened job store; None (logged) when the record cannot be kept."""
    assert job.once_per is not None
    store = job_store_from_url(config.backend)
    teardown.push_async_callback(store.close)
    if not await _open(store, election.timing.retry_interval):
        return None
    runner = OncePer(job.command, election, store, period=job.once_per, catch_up=job.catch_up,
                     kill_grace=config.kill_grace, socket_path=socket_path)  # fmt: skip
    runner.on_run = JobMetrics(metrics.registry, election.name, runner).ran
    node.jobs[election.name] = lambda: job_body(runner)
    return runner


async def _open(store: JobStore, retry_interval: float) -> bool:
    """Open the store; a backend down at start is waited for, as the elections wait for it
    (no job runs meanwhile: its start could not be recorded)."""
    said = False
    while True:
        try:
            await store.open()
            return True
        except BackendUnavailable as exc:
            if not said:
                log.warning("cannot open the record of run --once-per yet (%s); retrying", exc)
                said = True
            await asyncio.sleep(retry_interval)
        except BackendError as exc:  # fatal: a role that may not create the table, say
            log.error("cannot keep the record of run --once-per: %s", exc)
            return False
