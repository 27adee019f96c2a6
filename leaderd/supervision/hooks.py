"""Transition hooks: `--on-elected`, `--on-demoted`, `--on-stop` (docs/run.md, "Transition
hooks"). Policy only: which hook runs at which change of this node's leadership.

Each hook is a command run directly (no shell: write ``sh -c '...'`` for one), once per
transition, with ``LEADERD_ELECTION/NODE_ID/TERM/ROLE/PREVIOUS_ROLE/REASON`` and a timeout,
after which its process group is killed. Hooks of one election run one at a time, in the
order of the transitions: an elected hook never starts while a demote hook still runs.

The demote hook is done before the lease can expire, like `run --`'s child: it starts when
this node stops leading (a resign, a stop: before the release, so before any standby can
lead), and, while renewals fail, as soon as no more than ``hook_timeout`` is left of the
lease; it is killed at the lease deadline at the latest. The timing rules check at start
that ``hook_timeout`` fits between two renewals (config.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import signal
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..clock import boottime
from ..election.status import Role

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from ..election.engine import Election

log = logging.getLogger("leaderd.hooks")

_POLL = 0.1  # how often a leader's lease deadline is read again (as supervisor.py does)
StepDown = Callable[[str], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Hooks:
    """The hook commands (each split like a shell line, run without one) and their bound."""

    on_elected: tuple[str, ...] = ()
    on_demoted: tuple[str, ...] = ()
    on_stop: tuple[str, ...] = ()
    timeout: float = 5.0
    # --elected-hook-gates: "leader" only once the elected hook succeeded; a failure hands over.
    gates: bool = False

    @property
    def any(self) -> bool:
        return bool(self.on_elected or self.on_demoted or self.on_stop)


def before(first: StepDown, then: StepDown | None) -> StepDown:
    """A step-down hook that awaits ``first``, then ``then`` (the child stops before the
    demote hook runs; both before the release)."""

    async def step_down(name: str) -> None:
        await first(name)
        if then is not None:
            await then(name)

    return step_down


def counter(registry: CollectorRegistry) -> Callable[[str, str, str], None]:
    """leaderd_hook_runs_total{election, hook, result}: result ok, failed, timeout, error."""
    from prometheus_client import Counter  # the daemon's only: config.py imports this module

    runs = Counter("leaderd_hook_runs", "Transition hook runs, by how they ended.",
                   ["election", "hook", "result"], registry=registry)  # fmt: skip

    def counted(election: str, hook: str, result: str) -> None:
        kind = "ok" if result == "ok" else result.split()[0].replace("cannot", "error")
        runs.labels(election, hook, {"timed": "timeout"}.get(kind, kind)).inc()

    return counted


def start(
    elections: Iterable[tuple[Election, Hooks]], registry: CollectorRegistry
) -> list[asyncio.Task[None]]:
    """A runner for each election's own hooks (none without hooks), as tasks of the daemon's."""
    hooked = [(election, hooks) for election, hooks in elections if hooks.any]
    if not hooked:
        return []
    counted = counter(registry)
    runners = [HookRunner(election, hooks, counted) for election, hooks in hooked]
    return [asyncio.create_task(runner.run()) for runner in runners]


def parse_hooks(settings: dict[str, object], timeout: float, gates: bool = False) -> Hooks:
    """The hooks of the merged settings; ValueError names a command that is no command."""
    commands = {}
    for key in ("on_elected", "on_demoted", "on_stop"):
        text = str(settings.get(key) or "")
        try:
            commands[key] = tuple(shlex.split(text))
        except ValueError as exc:
            raise ValueError(f"{key}: {exc} in {text!r}") from None
    return Hooks(**commands, timeout=timeout, gates=gates and bool(commands["on_elected"]))


class HookRunner:
    """Runs one election's hooks at its transitions, one at a time."""

    def __init__(
        self, election: Election, hooks: Hooks, counted: Callable[[str, str, str], None]
    ) -> None:
        self.election, self.hooks = election, hooks
        self._counted = counted  # (election, hook, result): the metrics' hook
        self._elected_term: int | None = None  # the term the elected hook last ran for
        self._seen = Role.UNKNOWN  # the last role seen: a hook's previous role
        self._open_term = 0  # with gates: the term whose elected hook succeeded
        if hooks.gates:
            election.gate = lambda term: term == self._open_term
        self._lock = asyncio.Lock()
        self._stopped = False
        election.step_down_hook = before(self.step_down, election.step_down_hook)

    async def run(self) -> None:
        """Follow the election until cancelled."""
        while True:
            await self._follow()
            status = self.election.status()
            timeout = _POLL if self._elected_term is not None else 5.0
            await self.election.wait_for_change(status.revision, timeout)

    async def _follow(self) -> None:
        async with self._lock:
            if self._stopped:
                return
            lease = self.election.held_deadline()  # gated or not: the hook opens the gate
            role = self.election.status().role
            self._seen = self._seen if role in (Role.LEADER, Role.STOPPED) else role
            budget = self.hooks.timeout if self.hooks.on_demoted else 0.0
            leading = lease if lease is not None and lease[1] - boottime() > budget else None
            if self._elected_term is not None and (
                leading is None or leading[0] != self._elected_term
            ):
                await self._demoted(self._why(lease), lease[1] if lease else None)
            if self._elected_term is None and leading is not None:
                await self._elected(leading[0])

    def _why(self, lease: tuple[int, float] | None) -> str:
        if lease is None:
            return "lost leadership"
        if lease[0] != self._elected_term:
            return f"the term changed from {self._elected_term} to {lease[0]}"
        return f"lease deadline in {lease[1] - boottime():.1f}s"

    async def _elected(self, term: int) -> None:
        previous, self._elected_term, self._seen = self._seen, term, Role.LEADER
        result = await self._run("on_elected", self.hooks.on_elected, (Role.LEADER, previous), term,
                        "elected", None)  # fmt: skip
        if not self.hooks.gates:
            return
        if result == "ok":
            self._open_term = term
            self.election.status()  # publish "leader" now, not at the next answer
        else:
            log.error("election %s: the elected hook failed, handing over", self.election.name)
            self.election.resign(self.election.timing.ttl)

    async def _demoted(self, reason: str, deadline: float | None) -> None:
        term, self._elected_term = self._elected_term, None
        role = self.election.status().role
        role = Role.FOLLOWER if role is Role.LEADER else role  # about to lose it: demoted now
        await self._run("on_demoted", self.hooks.on_demoted, (role, Role.LEADER), term or 0, reason,
                        deadline)  # fmt: skip

    async def step_down(self, _name: str) -> None:
        """The engine's step-down hook (resign, stop): the demote hook, then on a stop the
        stop hook, both done before the release."""
        async with self._lock:
            stopping = self.election.status().role is Role.STOPPED
            if self._elected_term is not None:
                why = "shutting down" if stopping else "stepping down"
                lease = self.election.held_deadline()
                await self._demoted(why, lease[1] if lease else None)
            if stopping and not self._stopped:
                self._stopped = True
                term = self.election.status().term
                roles = (Role.STOPPED, self._seen)
                await self._run("on_stop", self.hooks.on_stop, roles, term, "shutting down", None)

    async def _run(
        self, hook: str, command: tuple[str, ...], roles: tuple[Role, Role], term: int,
        reason: str, deadline: float | None,
    ) -> str:  # fmt: skip
        """Run ``command`` for a change of role ``roles`` (new, previous), within the timeout
        and before ``deadline``: "ok", or what went wrong."""
        role, previous = roles
        if not command:
            return "ok"
        bound = self.hooks.timeout
        if deadline is not None:  # the lease ends first: never outlive it
            bound = min(bound, deadline - boottime())
        env = {**os.environ, "LEADERD_ELECTION": self.election.name,
               "LEADERD_NODE_ID": self.election.candidate.node_id, "LEADERD_TERM": str(term),
               "LEADERD_ROLE": role.value, "LEADERD_PREVIOUS_ROLE": previous.value,
               "LEADERD_REASON": reason}  # fmt: skip
        result = await _execute(list(command), env, max(bound, 0.0))
        self._counted(self.election.name, hook, result)
        line = f"{hook} hook '{shlex.join(command)}' for election {self.election.name}, term {term}"
        if result == "ok":
            log.info("%s (%s): done", line, reason)
        else:
            log.error("%s (%s): %s", line, reason, result)
            self.election.notes.add(term, f"{hook} hook {result}")  # for the term's history
        return result


async def _execute(command: list[str], env: dict[str, str], timeout: float) -> str:
    """Run ``command`` within ``timeout``: "ok", or why not ("failed with status N",
    "timed out after Ns: killed", "cannot start: ...")."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *command, env=env, stdin=asyncio.subprocess.DEVNULL, start_new_session=True
        )
    except OSError as exc:
        return f"cannot start: {exc.strerror or exc}"
    try:
        async with asyncio.timeout(timeout):
            code = await proc.wait()
    except (TimeoutError, asyncio.CancelledError) as exc:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await asyncio.shield(proc.wait())
        if isinstance(exc, asyncio.CancelledError):
            raise
        return f"timed out after {timeout:.3g}s: killed"
    return "ok" if code == 0 else f"failed with status {code}"
