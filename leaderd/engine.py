"""The election engine: all policy (timing, self-fencing, state, events) for one election.

Run is short: campaign with jitter, renew every renew_interval while leading, self-fence
on the local CLOCK_BOOTTIME deadline, and on stop publish "stopped", let the step-down hook
stop the supervised child, then release. Answers never read a flag that a timer sets:
``status()`` derives the role from the deadline at the moment it is asked (DESIGN §1.2).

A lease that another holder never released is taken over only after this node has seen
that very version of it unchanged for one ttl on its own clock (DESIGN §1.3), and the
engine never leads with a term at or below its high-water mark (DESIGN §1.4).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import math
import random
from collections.abc import Awaitable, Callable
from typing import Literal

from .backends.base import Backend, BackendError, Candidate, Lease, LeaseLost
from .clock import Clock, SystemClock
from .status import ElectionStatus, LeaderInfo, Role
from .timing import Timing
from .watchers import ChangeListener, Watchers

log = logging.getLogger("leaderd.engine")

# Awaited after this node stopped leading and before the lease is released.
StepDownHook = Callable[[str], Awaitable[None]]

_View = tuple[Role, LeaderInfo | None, int]
_Wake = Literal["poke", "change"] | None
_MIN_DELAY = 0.005  # never spin: even "at once" leaves the loop a breath
_WAKE_SPACING = 0.02  # a backend that reports changes nonstop gets at most one round per this
_STALL_SLACK = 2.0  # how late a loop turn may be before /health reports a stall


class Election:
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
        self.name = name
        self.candidate = candidate
        self.timing = timing
        self.step_down_hook: StepDownHook | None = None
        self._backend = backend
        self._clock: Clock = clock or SystemClock()
        self._jitter = jitter
        # What the backend last said, and the time the request was sent.
        self._lease: Lease | None = None
        self._seen_at = -math.inf
        # Another holder's lease as last seen (holder, instance, term, version), and since
        # when (the answer's arrival): it may be taken over one ttl later (DESIGN §1.3).
        self._watched: tuple[str | None, str, int, str] | None = None
        self._watched_since = math.inf
        # The highest term any answer ever showed: never lead at or below it (DESIGN §1.4).
        self.high_water = 0
        self._last_held_term: int | None = None
        # Counted for metrics: answers naming this node id under another instance, and
        # acquisitions refused because their term was not above the high-water mark.
        self.duplicates_seen = 0
        self.terms_refused = 0
        self._twins: set[str] = set()
        # Our hold: set only by a successful acquire/renew; the deadline self-fences it.
        self._held_term: int | None = None
        self._deadline = -math.inf
        self._renewed_at = -math.inf
        self._release_due: int | None = None
        # A request whose answer never came may have taken the lease, or a new term.
        self._maybe_held = False
        self._cooldown_until = -math.inf
        self._stopping = False
        # Moves on resign and stop: answers to requests sent before then win nothing.
        self._epoch = 0
        self._why = "starting"
        self.last_error: str | None = None
        self.last_contact: dt.datetime | None = None
        self.ready = False
        self._turn_due = math.inf
        # The last published (role, leader, term): each change is a new revision.
        self._published: tuple[Role, str | None, int] | None = None
        self._watchers = Watchers(name, self._clock.wall())
        self._poke = asyncio.Event()
        self._stopped = asyncio.Event()
        self._refresh(self._clock.now())

    # ---- answers: each derives the role from the clock at the moment it is asked ----

    def status(self) -> ElectionStatus:
        now = self._clock.now()
        return self._snapshot(self._refresh(now), now)

    def lease_left(self) -> float | None:
        """Seconds before the self-fence deadline while leading; None otherwise."""
        now = self._clock.now()
        role, _, _ = self._refresh(now)
        return self._deadline - now if role is Role.LEADER else None

    def lease_deadline(self) -> tuple[int, float] | None:
        """(term, self-fence deadline on CLOCK_BOOTTIME) while leading; None otherwise."""
        now = self._clock.now()
        role, _, term = self._refresh(now)
        return (term, self._deadline) if role is Role.LEADER else None

    def health(self) -> str | None:
        """None while the loop turns on time; else why it looks stalled."""
        late = self._clock.now() - self._turn_due
        return f"election {self.name} loop stalled for {late:.1f}s" if late > 0 else None

    @property
    def watchers(self) -> int:
        return self._watchers.count

    def add_listener(self, listener: ChangeListener) -> None:
        """Call ``listener`` synchronously with the new status on every revision."""
        self._watchers.add_listener(listener)

    async def wait_for_change(self, revision: int | None, timeout: float) -> ElectionStatus:
        """Long poll: the status once its revision differs from ``revision`` (or the
        next change when None), or the current status after ``timeout`` seconds."""
        return await self._watchers.wait(self.status, revision, timeout)

    def stream(self) -> contextlib.AbstractContextManager[asyncio.Queue[ElectionStatus]]:
        """A queue that receives the current status, then one status per change."""
        return self._watchers.stream(self.status())

    # ---- actions ----

    def resign(self, cooldown: float) -> None:
        """Stop leading now, release at the loop's next turn, campaign again after cooldown."""
        now = self._clock.now()
        self._epoch += 1
        self._cooldown_until = now + cooldown
        if self._held_term is not None:
            self._release_due, self._held_term = self._held_term, None
            self._why = f"resigned, not campaigning for {cooldown:g}s"
        self._refresh(now)
        self._poke.set()

    def stop(self) -> None:
        """Publish "stopped" at once; ``run`` then runs the step-down hook and releases."""
        self._stopping = True
        self._epoch += 1
        self._why = "shutting down"
        self._refresh(self._clock.now())
        self._poke.set()
        self._stopped.set()

    async def run(self) -> None:
        """Campaign until ``stop()``; then hand over: step-down hook, then release."""
        start_jitter = self._jitter() * min(0.05, self.timing.retry_interval)
        next_round = self._clock.now() + start_jitter
        round_at = -math.inf
        while not self._stopping:
            now = self._clock.now()
            self._refresh(now)  # publish role changes that time alone made (deadline passed)
            if now >= next_round:
                self._poke.clear()  # this round answers every resign so far
                round_at, next_round = now, now + await self.round()
                now = self._clock.now()
            wake_at = min(next_round, self._next_boundary(now))
            # Leaders listen too: an advisory lock's session can end under them. A change can
            # only bring the next round forward if it is more than a breath away.
            follow = next_round - now > _WAKE_SPACING
            self._turn_due = wake_at + self._request_timeout(wake_at) + _STALL_SLACK
            woke = await self._wait(wake_at - now, follow)
            if woke == "poke":
                next_round = self._clock.now()
            elif woke == "change":
                next_round = max(self._clock.now(), round_at + _WAKE_SPACING)
        self._turn_due = math.inf
        await self._hand_over()

    async def round(self) -> float:
        """One acquire-or-renew (an observe while cooling down); seconds to the next round."""
        if self._release_due is not None:
            await self._hand_over()
        t_send, epoch = self._clock.now(), self._epoch
        campaigning = self._campaigning(t_send)
        timeout = self._request_timeout(t_send)
        wait = self._follow_period(self._lease) if campaigning and self._held_term is None else 0
        self._turn_due = t_send + timeout + wait + _STALL_SLACK
        try:
            request = self._request(campaigning, timeout, wait, self._takeover(t_send))
            lease = await self._send(request, timeout + wait)
        except (BackendError, TimeoutError) as exc:
            self._maybe_held = self._maybe_held or campaigning
            self._on_failure(exc)
            return self._jittered(self.timing.retry_interval)
        except Exception as exc:
            # A backend bug (an untranslated driver error) fails closed like an outage.
            log.exception("election %s: backend raised %r", self.name, exc)
            self._maybe_held = self._maybe_held or campaigning
            self._on_failure(exc)
            return self._jittered(self.timing.retry_interval)
        if lease is None:  # abandoned for stop(): the hand-over looks the lease up
            self._maybe_held = self._maybe_held or campaigning
            return _MIN_DELAY
        # A resign or stop that came while the request was in flight wins over its answer,
        # even when its cooldown is already over.
        campaigning = campaigning and epoch == self._epoch
        self._on_lease(lease, t_send, campaigning)
        now = self._clock.now()
        if self._held_term is not None:
            return max(_MIN_DELAY, t_send + self.timing.renew_interval - now)
        if self._release_due is not None:
            return _MIN_DELAY  # an acquisition this node may not keep: release it now
        delay = self._follow_delay(lease, now)
        if not campaigning:
            delay = min(delay, self._cooldown_until - now)
        return max(_MIN_DELAY, delay)

    # ---- the round's parts ----

    async def _send(self, request: Awaitable[Lease], timeout: float) -> Lease | None:
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
                nap = max(_MIN_DELAY, min(give_up, self._next_boundary(now)) - now)
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

    async def _request(
        self, campaigning: bool, timeout: float, wait: float, takeover: str
    ) -> Lease:
        if not campaigning:
            return await self._backend.observe(self.name)
        return await self._backend.acquire_or_renew(
            self.name,
            self.candidate,
            self.timing.ttl,
            timeout,
            wait,
            takeover=takeover,
            min_term=self.high_water + 1,
        )

    def _takeover(self, now: float) -> str:
        """The version of an unreleased lease this node may take over now: one it has seen
        unchanged for one ttl on its own clock (DESIGN §1.3); "" for none."""
        if self._watched is None or now < self._watched_since + self.timing.ttl:
            return ""
        return self._watched[3]

    def _on_lease(self, lease: Lease, t_send: float, campaigning: bool) -> None:
        now = self._clock.now()
        high_water, self.high_water = self.high_water, max(self.high_water, lease.term)
        self._lease, self._seen_at, self.last_error = lease, t_send, None
        self.last_contact, self.ready, self._maybe_held = self._clock.wall(), True, False
        self._watch(lease, now)
        me = self.candidate
        acquired = lease.held_by(me) and lease.term != self._last_held_term
        if acquired and lease.term <= high_water:
            self._refuse(lease, high_water)
        elif lease.held_by(me) and campaigning:
            # A renewal that answers after a pause yields a deadline already past: fenced.
            self._held_term, self._deadline, self._renewed_at = (
                lease.term,
                self._deadline_after(t_send, lease),
                t_send,
            )
            self._last_held_term = lease.term
            self._why = f"holding the lease, term {lease.term}"
        elif lease.held_by(me):
            # A request sent before resign/stop won the lease: give it back.
            self._release_due, self._held_term = lease.term, None
        else:
            if self._held_term is not None:
                self._why = f"{lease.holder or 'nobody'} holds the lease (term {lease.term})"
            self._held_term = None
        self._refresh(now)

    def _watch(self, lease: Lease, now: float) -> None:
        """Follow another holder's lease: the takeover clock restarts at every change."""
        if lease.holder is None or lease.held_by(self.candidate):
            self._watched, self._watched_since = None, math.inf
            return
        if lease.held_by_twin(self.candidate) and lease.instance not in self._twins:
            self._twins.add(lease.instance)
            self.duplicates_seen += 1
            log.error(
                "election %s: node id %s is held by another process (instance %s; this one "
                "is %s): either a second daemon runs with this node id (make node ids "
                "unique) or this daemon restarted within one ttl; waiting for that lease "
                "to end",
                self.name,
                lease.holder,
                lease.instance or "unknown",
                self.candidate.instance,
                extra={"event": "duplicate_node_id", "election": self.name, "term": lease.term},
            )
        key = (lease.holder, lease.instance, lease.term, lease.version)
        if key != self._watched:
            self._watched, self._watched_since = key, now

    def _refuse(self, lease: Lease, high_water: int) -> None:
        """The backend granted a term this node has already seen: it lost acknowledged
        writes (an asynchronous commit, a restored backup). Lead with none of it."""
        self.terms_refused += 1
        self._release_due, self._held_term = lease.term, None
        log.error(
            "election %s: the backend granted term %d, but this node already saw term %d: "
            "the backend lost acknowledged writes; refusing to lead, releasing it and asking "
            "for term %d or above",
            self.name,
            lease.term,
            high_water,
            high_water + 1,
            extra={"event": "term_refused", "election": self.name, "term": lease.term},
        )

    def _on_failure(self, exc: BaseException) -> None:
        reason = str(exc) or "request timed out"
        # An outage fails every retry the same way: log it when it starts or changes.
        repeated = reason == self.last_error
        self.last_error = reason
        self.ready = True  # "unknown" is an answer: readiness never waits for the backend
        if isinstance(exc, LeaseLost) and self._held_term is not None:
            self._held_term, self._why = None, reason  # gone for good: no wait for the deadline
        now = self._clock.now()
        level = logging.DEBUG if repeated else logging.WARNING
        if self._held_term is not None and now < self._deadline:
            log.log(
                level,
                "renew of election %s failed: %s; deadline in %.1fs",
                self.name,
                reason,
                self._deadline - now,
                extra={"event": "renew_failed", "election": self.name, "reason": reason},
            )
        else:
            log.log(
                level,
                "election %s: backend request failed: %s",
                self.name,
                reason,
                extra={"event": "backend_error", "election": self.name, "reason": reason},
            )
        self._refresh(now)

    async def _hand_over(self) -> None:
        """After leadership ended voluntarily: stop the child, then release the lease."""
        term = self._release_due if self._release_due is not None else self._held_term
        if term is None and self._lease is not None and self._lease.held_by(self.candidate):
            term = self._lease.term
        self._release_due, self._held_term = None, None
        self._refresh(self._clock.now())
        if self.step_down_hook is not None:
            await self.step_down_hook(self.name)
        if self._maybe_held:  # a request whose answer never came may have changed the lease
            term = await self._own_term(default=term)
        if term is None:
            return
        try:
            await asyncio.wait_for(
                self._backend.release(self.name, self.candidate, term), self.timing.renew_interval
            )
        except (BackendError, TimeoutError) as exc:
            log.warning(
                "could not release election %s, term %d: %s; it expires by itself within ttl",
                self.name,
                term,
                str(exc) or "request timed out",
                extra={"event": "release_failed", "election": self.name, "term": term},
            )
            return
        log.info(
            "released election %s, term %d",
            self.name,
            term,
            extra={"event": "released", "election": self.name, "term": term},
        )

    async def _own_term(self, default: int | None) -> int | None:
        """The term of the lease if the backend says this node holds it, None if it does
        not; ``default`` if the backend cannot say."""
        try:
            lease = await asyncio.wait_for(
                self._backend.observe(self.name), self.timing.renew_interval
            )
        except (BackendError, TimeoutError):
            return default
        self._maybe_held = False
        return lease.term if lease.held_by(self.candidate) else None

    async def _wait(self, timeout: float, follow: bool) -> _Wake:
        """Sleep up to ``timeout``; say whether a poke (resign, stop) or a backend change
        woke it early. A wait_for_change that fails is no change: sleep on, pokes only."""
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
                    if change.exception() is None:
                        return "change"
                    tasks.discard(change)
        except TimeoutError:
            return None
        finally:
            for task in tasks:
                task.cancel()
            # The backend call must be over before the next one starts (one call per election).
            await asyncio.gather(*tasks, return_exceptions=True)

    # ---- derived state ----

    def _campaigning(self, now: float) -> bool:
        return not self._stopping and now >= self._cooldown_until

    def _leading(self, now: float) -> bool:
        return self._held_term is not None and not self._stopping and now < self._deadline

    def _deadline_after(self, t_send: float, lease: Lease) -> float:
        """DESIGN §1.2, trusting no more time than the backend says it granted."""
        timing = self.timing
        granted = timing.ttl if lease.expires_in is None else min(timing.ttl, lease.expires_in)
        return t_send + granted * (1.0 - timing.clock_drift) - timing.safety_margin

    def _request_timeout(self, now: float) -> float:
        if self._held_term is not None and self._deadline > now:
            return max(_MIN_DELAY, self._deadline - now)
        return self.timing.renew_interval

    def _follow_period(self, lease: Lease | None) -> float:
        """How long a follower may sleep (or block in the backend) before its next round.

        A free lease: renew_interval (its release or acquisition wakes us anyway). Another
        holder's: retry_interval, to see each renewal within it (so a dead holder is taken
        over within ttl + retry_interval), and never past the moment it may be taken over.
        """
        if lease is None or lease.holder is None:
            return self.timing.renew_interval
        now = self._clock.now()
        takeover_in = self._watched_since + self.timing.ttl - now
        period = min(self.timing.retry_interval, takeover_in)
        if lease.expires_in is not None:
            period = min(period, max(lease.expires_in - (now - self._seen_at), takeover_in))
        return max(_MIN_DELAY, period)

    def _follow_delay(self, lease: Lease, now: float) -> float:
        """Seconds to the next round of a follower that just got ``lease``."""
        if lease.holder is None:
            return self._jittered(self.timing.renew_interval)
        # Watching a holder needs no jitter; taking over after it (one round) is a CAS.
        return self._follow_period(lease)

    def _jittered(self, delay: float) -> float:
        return delay + min(delay * 0.2, self.timing.retry_interval / 2) * self._jitter()

    def _next_boundary(self, now: float) -> float:
        """The next instant at which the derived role changes with no request at all."""
        edges = [self._deadline, self._seen_at + self.timing.ttl]
        if self._lease is not None and self._lease.expires_in is not None:
            edges.append(self._seen_at + self._lease.expires_in)
        return min((t for t in edges if t > now), default=math.inf)

    def _view(self, now: float) -> _View:
        lease = self._lease
        term = lease.term if lease is not None else 0
        if self._stopping:
            return Role.STOPPED, None, term
        if self._leading(now) and lease is not None:
            me = self.candidate
            info = LeaderInfo(me.node_id, me.address, lease.term, lease.acquired_at)
            return Role.LEADER, info, lease.term
        # Fail closed: knowledge older than one ttl, or our own lapsed hold, names nobody.
        if lease is None or now - self._seen_at >= self.timing.ttl or self._held_term is not None:
            return Role.UNKNOWN, None, term
        expired = lease.expires_in is not None and now >= self._seen_at + lease.expires_in
        if lease.holder is None or lease.held_by(self.candidate) or expired:
            return Role.FOLLOWER, None, term
        info = LeaderInfo(lease.holder, lease.address, lease.term, lease.acquired_at)
        return Role.FOLLOWER, info, term

    def _snapshot(self, view: _View, now: float) -> ElectionStatus:
        role, leader, term = view
        return ElectionStatus(
            election=self.name,
            node_id=self.candidate.node_id,
            role=role,
            leader=leader,
            term=term,
            ttl=self.timing.ttl,
            valid_for=self._deadline - now if role is Role.LEADER else None,
            revision=self._watchers.revision,
            changed_at=self._watchers.changed_at,
        )

    def _refresh(self, now: float) -> _View:
        """Derive the view; on a change of role, leader or term, publish a new revision."""
        view = self._view(now)
        role, leader, term = view
        key = (role, leader.node_id if leader else None, term)
        if key == self._published:
            return view
        previous, self._published = self._published, key
        self._watchers.next_revision(self._clock.wall())
        self._log_change(previous, view, now)
        self._watchers.publish(self._snapshot(view, now))
        return view

    def _log_change(
        self, previous: tuple[Role, str | None, int] | None, view: _View, now: float
    ) -> None:
        role, leader, term = view
        holder = leader.node_id if leader else None
        if role is Role.LEADER:
            sentence = f"acquired election {self.name}, term {term}"
        elif previous is not None and previous[0] is Role.LEADER:
            why = self._why
            if self._held_term is not None and now >= self._deadline:
                why = f"no successful renewal for {now - self._renewed_at:.1f}s, deadline passed"
            # The term this node held, not the new holder's.
            sentence = f"stepping down from election {self.name}, term {previous[2]}: {why}"
        elif role is Role.STOPPED:
            sentence = f"stopped campaigning in election {self.name}"
        elif role is Role.UNKNOWN:
            why = self.last_error or "no answer from the backend yet"
            sentence = f"leader of election {self.name} unknown: {why}"
        elif leader is not None:
            sentence = f"following {holder} in election {self.name}, term {term}"
        else:
            sentence = f"election {self.name} has no leader"
        level = logging.DEBUG if previous is None else logging.INFO
        extra = {"event": role.value, "election": self.name, "term": term, "holder": holder}
        log.log(level, sentence, extra=extra)
