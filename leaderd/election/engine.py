"""The election engine: the asyncio loop that contests one election for this node.

Run is short: campaign with jitter, renew every renew_interval while leading, self-fence
on the local CLOCK_BOOTTIME deadline, and on stop publish "stopped", let the step-down hook
stop the supervised child, then release. The rules (what the answer is at time t, what to
send, when) live in state.py, which has no asyncio: this module sends requests, waits and
logs the sentences the rules return. The answers and their revisions are answers.py's:
they never read a flag that a timer sets, ``status()`` derives the role at the moment it
is asked (docs/algorithm.md, "Self-fencing").
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Literal, TypeVar

from .. import held_logs
from ..backends.asks import Release
from ..backends.base import Backend, BackendError, Candidate, Capability, Grant, Lease, LeaseLost
from ..backends.records import HISTORY_RETENTION, LEFT_TTL, EndReason
from ..clock import Clock, SystemClock
from ..events import Event, extra
from .answers import ElectionAnswers
from .candidacy import Failback, barred, decide, standbys
from .heir import heir_of
from .history import History
from .release_doubt import version_of
from .state import MIN_DELAY
from .switchover_request import due_to, still_wanted
from .term_notes import TermNotes
from .timing import Timing
from .values import Request

log = logging.getLogger("leaderd.engine")

# Awaited after this node stopped leading and before the lease is released.
StepDownHook = Callable[[str], Awaitable[None]]

_Wake = Literal["poke", "change"] | Grant | LeaseLost | None
_Held = tuple[int, str] | None  # a term this process holds, and the version last answered
_WAKE_SPACING = 0.02  # a backend that reports changes nonstop gets at most one round per this
_STALL_SLACK = 2.0  # how late a loop turn may be before /health reports a stall
T = TypeVar("T")


class Election(ElectionAnswers):
    """One election, as seen and contested by this node."""

    def __init__(
        self,
        name: str,
        candidate: Candidate,
        timing: Timing,
        backend: Backend,
        clock: Clock | None = None,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.step_down_hook: StepDownHook | None = None
        # Who may lead (candidacy.py): why this node's checks fail ("" while they pass), and
        # what it does when they fail while it leads.
        self.unhealthy: Callable[[], str] = str
        self.on_unhealthy = "handover"
        self.failback = Failback(None)
        self._end_reason = ""  # how the next release ends the term, when neither resign nor stop
        self.notes = TermNotes()  # hook failures, recorded by the release of their term
        self._backend = backend
        self._poke, self._stopped = asyncio.Event(), asyncio.Event()
        super().__init__(name, candidate, timing, clock or SystemClock(), jitter)

    # ---- actions ----

    @property
    def _grants(self) -> bool:
        return Capability.GRANTS in self._backend.capabilities

    @property
    def reserves(self) -> bool:
        """Whether the backend can reserve the lease for a chosen standby."""
        return Capability.RESERVES in self._backend.capabilities

    def resign(self, cooldown: float, to: str = "") -> None:
        """Stop leading now, release at the loop's next turn (reserved for node id ``to``
        for one ttl, if given), campaign again after cooldown."""
        now = self._clock.now()
        self.state.resign(now, cooldown, to)
        self._refresh(now)
        self._poke.set()

    def poke(self) -> None:
        """Run a round now (this node's health changed)."""
        self._poke.set()

    def stop(self) -> None:
        """Publish "stopped" at once; ``run`` then runs the step-down hook and releases."""
        if self.state.stopping:
            return
        self.state.stop()
        self._refresh(self._clock.now())
        self._poke.set()
        self._stopped.set()

    async def run(self) -> None:
        """Campaign until ``stop()``; then hand over: step-down hook, then release."""
        start_jitter = self.state.jitter() * min(0.05, self.timing.retry_interval)
        next_round = self._clock.now() + start_jitter
        round_at = -math.inf
        while not self.state.stopping:
            now = self._clock.now()
            self._refresh(now)  # publish role changes that time alone made (deadline passed)
            if now >= next_round:
                self._poke.clear()  # this round answers every resign so far
                round_at, next_round = now, now + await self.round()
                now = self._clock.now()
            wake_at = min(next_round, self.state.next_boundary(now))
            # Leaders listen too: an advisory lock's session can end under them, etcd can delete
            # their key (LeaseLost), so a holder listens up to its very next round. Otherwise a
            # change can only bring the next round forward if it is more than a breath away.
            follow = self.state.held_term is not None or next_round - now > _WAKE_SPACING
            self._turn_due = wake_at + self.state.request_timeout(wake_at) + _STALL_SLACK
            woke = await self._wait(wake_at - now, follow)
            granted = self._take_grant(woke) if isinstance(woke, Grant) else None
            if isinstance(woke, LeaseLost):
                self._lose(woke)
            if granted is not None:
                next_round = self._clock.now() + granted
            elif woke == "poke":
                next_round = self._clock.now()
            elif woke is not None:  # a change, a loss, or a grant only a round can tell about
                next_round = max(self._clock.now(), round_at + _WAKE_SPACING)
        self._turn_due = math.inf
        await self._hand_over()

    async def round(self) -> float:
        """One acquire-or-renew (an observe while cooling down); seconds to the next round."""
        if self.state.release_due is not None:
            await self._hand_over()
        self._note_health()
        t_send = self._clock.now()
        request = self.state.request(t_send)
        self._turn_due = t_send + request.ask.timeout + request.ask.wait + _STALL_SLACK
        try:
            lease = await self._send(self._ask(request), request.ask.timeout + request.ask.wait)
        except (BackendError, TimeoutError) as exc:
            self._on_failure(exc, request)
            return self.state.retry_delay()
        except Exception as exc:
            # A backend bug (an untranslated driver error) fails closed like an outage.
            log.exception("election %s: backend raised %r", self.name, exc)
            self._on_failure(exc, request)
            return self.state.retry_delay()
        if lease is None:  # abandoned for stop(): the hand-over looks the lease up
            self.state.on_abandoned(request)
            return MIN_DELAY
        now = self._clock.now()
        if not lease.cached:  # news from a cache is no contact, and its members are old
            self.last_contact = self._clock.wall()
            self._heard, self._heard_at = lease.members, t_send
        self._heartbeats.note(lease, t_send)
        self._log_notes(self.state.on_lease(lease, request, t_send, now))
        self._refresh(now)
        self._who_leads(now)
        await self._read_history(lease, bool(request.ask.lost_term))
        return self.state.next_round(request, t_send, self._clock.now())

    # ---- the round's parts ----

    def ask_switchover(self, request: str) -> None:
        """Carry ``request`` (switchover_request.py; "" withdraws it) in this node's
        heartbeats, starting with a round now."""
        self._heartbeat(self.candidate.health, request)
        self._poke.set()

    def _note_health(self) -> None:
        """Carry this node's health (and its switchover request, while wanted) into its next
        heartbeat; bar its candidacy while its checks fail or it is a witness
        (docs/algorithm.md, "Who leads")."""
        leader = self.state.view(self._clock.now()).leader
        wanted = still_wanted(self.candidate.switchover, leader, self._wall())
        self._heartbeat(self.unhealthy(), wanted)
        self.state.barred = barred(self.candidate)

    def _heartbeat(self, health: str, switchover: str) -> None:
        if (health, switchover) != (self.candidate.health, self.candidate.switchover):
            self.candidate = replace(self.candidate, health=health, switchover=switchover)
            self.state.candidate = self.candidate

    def _wall(self) -> float:
        return self._clock.wall().timestamp()

    def _who_leads(self, now: float) -> None:
        """After a leader's round: hand over the ordinary way (child stopped first) when
        candidacy.decide says so; reserved for the node it names where the backend reserves,
        else with a cooldown of one ttl."""
        if not self.state.leading(now):
            return self.failback.reset()
        able = standbys(self._heard, self.candidate, now - self._heard_at, self._grants)
        asked = due_to(self._heard, able, self.candidate.node_id, self._wall())
        decided = decide(self.on_unhealthy, self.failback, self.candidate, able, now, asked)
        if decided is not None:
            to, self._end_reason = decided
            log.warning("election %s, term %d: %s", self.name, self.state.held_term,
                        self._end_reason)  # fmt: skip
            # Unreserved, the free lease goes to whoever asks first, this node too: a hand-over
            # to a named node (failback) keeps out of the race for one ttl, so that node wins.
            cooldown = self.timing.ttl if to and not self.reserves else 0.0
            self.resign(cooldown, to if self.reserves else "")

    def _take_grant(self, grant: Grant) -> float | None:
        """Lead on a release's grant, self-fencing from the request whose heartbeat its
        expiry counts from (docs/algorithm.md, "One-write hand-over"): no write of our own.
        Seconds to the next round; None when only a round can tell."""
        t_send = self._heartbeats.sent_at(grant.heard_at)
        if t_send is None:  # not a heartbeat of a request of ours answered: ask the backend
            return None
        now = self._clock.now()
        outcome = self.state.on_grant(grant.lease, t_send, now)
        if outcome is None:
            return None
        self._refresh(now)
        if not outcome:
            return 0.0  # the next round releases it
        log.debug("election %s: granted term %d by the release", self.name, grant.lease.term)
        return max(MIN_DELAY, t_send + self.timing.renew_interval - now)

    def _lose(self, lost: LeaseLost) -> None:
        """A change the backend saw ended our hold (etcd deleted our key): step down now,
        before any request; the next round asks again."""
        self.state.on_lost(str(lost))
        self._refresh(self._clock.now())

    async def _read_history(self, lease: Lease, relabeled: bool) -> None:
        """Read the history again when the holder changed since the last read (or a record
        was relabeled): a handover is when it changes. A failure waits for the next round."""
        seen = (lease.holder, lease.instance, lease.term)
        if seen == self._history_of and not relabeled:
            return
        timeout = min(self.timing.retry_interval, self.state.request_timeout(self._clock.now()))
        read = self._backend.history(self.name, HISTORY_RETENTION)
        try:
            records = await self._send(read, timeout)
        except Exception as exc:  # the history never stops an election, whatever it raises
            log.debug("election %s: reading the history failed: %r", self.name, exc)
            return
        if records is not None:
            self._history = History(self.name, tuple(records), self._clock.wall())
            self._history_of = seen

    async def _send(self, request: Awaitable[T], timeout: float) -> T | None:
        """The answer within ``timeout`` (else TimeoutError), or None if stop() came first:
        a hand-over must not wait for a slow backend, shutdown_timeout bounds it."""
        answer = asyncio.ensure_future(request)
        stopped = asyncio.ensure_future(self._stopped.wait())
        give_up = self._clock.now() + timeout
        try:
            while True:
                now = self._clock.now()
                if now >= give_up:
                    raise TimeoutError
                nap = max(MIN_DELAY, min(give_up, self.state.next_boundary(now)) - now)
                done, _ = await asyncio.wait(
                    (answer, stopped), timeout=nap, return_when=asyncio.FIRST_COMPLETED
                )
                if done:
                    break
                self._refresh(self._clock.now())  # time alone changed the role: tell now
        finally:
            answer.cancel()
            stopped.cancel()
            # The backend call must be over before the next one starts (one call per election).
            await asyncio.gather(answer, stopped, return_exceptions=True)
        return answer.result() if answer in done else None

    async def _ask(self, request: Request) -> Lease:
        if not request.campaigning:  # cooling down: still a member
            return await self._backend.observe(self.name, self.candidate, self.timing.ttl)
        return await self._backend.acquire_or_renew(request.ask)

    def _on_failure(self, exc: BaseException, request: Request) -> None:
        state = self.state
        reason = str(exc) or "request timed out"
        # An outage fails every retry the same way: log it when it starts or changes.
        level = logging.DEBUG if reason == state.last_error else logging.WARNING
        now = self._clock.now()
        if state.leading(now):
            sentence = f"renew of election {self.name} failed: {reason}; deadline in "
            sentence += f"{state.deadline - now:.1f}s"
            event = Event.RENEW_FAILED
        else:
            sentence = f"election {self.name}: backend request failed: {reason}"
            event = Event.BACKEND_ERROR
        log.log(level, sentence, extra=extra(event, election=self.name, reason=reason))
        first, before = not state.ready, self._published
        state.on_failure(exc, request)
        view = self._refresh(now)
        if first and before is not None and view.key == before.key:
            # The first attempt is over: readiness moved although the answer did not.
            self._watchers.announce(self._snapshot(view, now))

    async def _hand_over(self) -> None:
        """After leadership ended voluntarily: stop the child, then release the lease."""
        ended = EndReason.RESIGNED if self.state.resigned else EndReason.RELEASED
        reason, self._end_reason = self._end_reason or ended, ""
        self.state.resigned = False
        term = self.state.term_to_release()
        held = None if term is None else (term, version_of(self.state.lease, self.candidate, term))
        to = self.state.reservation_due()
        self._refresh(self._clock.now())
        if self.step_down_hook is not None:
            await self.step_down_hook(self.name)
        if self.state.maybe_held:  # a request whose answer never came may have changed it
            held = await self._own_lease(default=held, leave=self.state.stopping)
        elif held is None and self.state.stopping:
            # Our last write leaves (a release may grant us the lease as we stop: give it back).
            held = await self._own_lease(default=None, leave=True, brief=True)
        if held is None:
            return
        term, version = held
        heir = heir_of(self.candidate) if self._grants and not to else None
        release = self._backend.release(Release(self.name, self.candidate, term,
            self.notes.ended(term, reason), version, to, self.timing.ttl, heir))  # fmt: skip
        try:
            # A timeout block, not wait_for: the release starts now, not a loop turn later.
            async with asyncio.timeout(self.timing.renew_interval):
                await release
        except Exception as exc:  # a backend bug (untranslated) too: it may have landed
            self.state.in_doubt.on_unknown(term)  # it may land later: never lead on term again
            known = isinstance(exc, BackendError | TimeoutError)
            why = (str(exc) or "request timed out") if known else repr(exc)
            fields = extra(Event.RELEASE_FAILED, election=self.name, term=term, reason=why)
            log.warning("could not release election %s, term %d: %s; it expires by itself "
                        "within ttl", self.name, term, why, extra=fields,
                        exc_info=None if known else exc)  # fmt: skip
            return
        finally:
            held_logs.release()  # kept lines wait for the answer (held_logs.py)
        reserved = f", reserved for {to} for {self.timing.ttl:g}s" if to else ""
        fields = extra(Event.RELEASED, election=self.name, term=term, reserved_for=to or None)
        log.info("released election %s, term %d%s", self.name, term, reserved, extra=fields)
        if to:
            self.state.on_reserved(to, term)
        if self.state.stopping:  # the release kept us listed: the last write leaves
            await self._own_lease(default=None, leave=True, brief=True)

    async def _own_lease(self, default: _Held, leave: bool = False, brief: bool = False) -> _Held:
        """The term and version of the lease if the backend says this node holds it, None
        if it does not; ``default`` if the backend cannot say. ``leave``: a stopping
        node's last heartbeat, which no longer campaigns, so no release grants it the
        lease, with ttl 0 so that it leaves the live members at once (no switchover picks
        it). ``brief``: a stop must not wait long on a backend that is down."""
        heard = (self.candidate, LEFT_TTL) if leave else ()
        timeout = min(self.timing.retry_interval, 1.0) if brief else self.timing.renew_interval
        try:
            async with asyncio.timeout(timeout):
                lease = await self._backend.observe(self.name, *heard)
        except (BackendError, TimeoutError) as exc:
            said = "leaving the members" if leave else "reading the lease as it ends"
            log.info("election %s: %s failed: %s", self.name, said, str(exc) or "timed out")
            return default
        self.state.maybe_held = False
        return (lease.term, lease.version) if lease.held_by(self.candidate) else None

    async def _wait(self, timeout: float, follow: bool) -> _Wake:
        """Sleep up to ``timeout``; say whether a poke (resign, stop) or a backend change
        woke it early. A wait_for_change that fails is no change: sleep on, pokes only;
        except LeaseLost: the change ended our hold."""
        if timeout <= 0:
            return None
        poke: asyncio.Future[object] = asyncio.ensure_future(self._poke.wait())
        tasks: set[asyncio.Future[object]] = {poke}
        if follow:
            tasks.add(asyncio.ensure_future(self._backend.wait_for_change(self.name, timeout)))
        try:
            async with asyncio.timeout(timeout):
                while True:
                    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                    if poke in done:
                        return "poke"
                    change = done.pop()
                    failed = change.exception()
                    if failed is None:
                        grant = change.result()
                        return grant if isinstance(grant, Grant) else "change"
                    if isinstance(failed, LeaseLost):
                        return failed
                    tasks.discard(change)
        except TimeoutError:
            return None
        finally:
            for task in tasks:
                task.cancel()
            # The backend call must be over before the next one starts (one call per election);
            # the poke's waiter may end after: awaiting it would delay a grant by loop turns.
            calls = [task for task in tasks if task is not poke and not task.done()]
            if calls:
                await asyncio.gather(*calls, return_exceptions=True)
