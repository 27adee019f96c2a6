"""`leaderd jobs` and the checks of `run --once-per` (docs/run.md, "Once per period")."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

EXIT_OK = 0


def add_parser(sub: Any, client_options: Any) -> None:
    jobs = sub.add_parser("jobs", help="run --once-per jobs: last start, end, status, next due")
    client_options(jobs)
    jobs.add_argument("--json", action="store_true", help="print the JSON answer")


def misuse(args: argparse.Namespace, command: list[str], backend: str) -> str | None:
    """Why `run --once-per`/`--catch-up` cannot be as given; None when they can."""
    from ..backends.jobs import supports_jobs

    once_per = getattr(args, "once_per", None)
    if getattr(args, "catch_up", False) and once_per is None:
        return "--catch-up goes with --once-per"
    if once_per is not None and not command:
        return "--once-per goes with -- COMMAND"
    if once_per is not None and not supports_jobs(backend):
        return "--once-per records its runs in the backend: static:// keeps no record"
    return None


def show(
    body: dict[str, Any], as_json: bool, columns: Callable[[Sequence[tuple[str, ...]]], str]
) -> int:
    """Print a GET /jobs answer as a table (``--json`` printed it already)."""
    from ..api.jobs import job_rows

    if not as_json:
        sys.stdout.write(columns(job_rows(body)))
    return EXIT_OK
