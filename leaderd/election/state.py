"""What this node knows and holds in one election, and the rules that turn it into answers.

No asyncio and no I/O: the engine (engine.py) feeds in the backend's answers and failures
with the times they happened, and asks what the answer is at time ``now``, what to send
next, and when. Every rule of docs/algorithm.md lives here, and its state table is tested
row by row against this class (tests/engine/test_rules.py). Times are seconds on the
engine's clock (CLOCK_BOOTTIME).
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable

from ..backends.asks import Ask
from ..backends.base import Candidate, Lease, LeaseLost
from ..events import Event
from .release_doubt import ReleaseInDoubt
from .status import LeaderInfo, Role
from .timing import Timing
from .values import Note, Request, View, duplicate_note, refused_note

MIN_DELAY = 0.005  # never spin: even "at once" leaves the loop a breath


class ElectionState:
    """One election as this node sees it: the last lease, its own hold, what it watches."""

    def __init__(
        self,
        name: str,
        candidate: Candidate,
        timing: Timing,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.name = name
        self.candidate = candidate
        self.timing = timing
        self.jitter = jitter
        # What the backend last said, and when the request that got it was sent.
        self.lease: Lease | None = None
        self.seen_at = -math.inf
        # Another holder's lease as last seen (holder, instance, term, version), and since
        # when (the answer's arrival): it may be taken over one ttl later
        # (docs/algorithm.md, "Holders, instances and taking over").
        self.watched: tuple[str | None, str, int, str] | None = None
        self.watched_since = math.inf
        # The highest term any answer ever showed: never lead at or below it
        # (docs/algorithm.md, "The term high-water mark").
        self.high_water = 0
        self.last_held_term: int | None = None
        self.duplicates_seen = 0
        self.terms_refused = 0
        self.twins: set[str] = set()
        # Our hold: set only by a successful acquire/renew; the deadline self-fences it.
        self.held_term: int | None = None
        self.deadline = -math.inf
        self.renewed_at = -math.inf
        self.release_due: int | None = None
        # A request whose answer never came may have taken the lease, or a new term.
        self.maybe_held = False
        self.in_doubt = ReleaseInDoubt()  # a release that may still land: never lead on its term
        self.cooldown = 0.0
        self.cooldown_until = -math.inf
        # A hand-over (resign with a chosen standby): the node id the next release reserves
        # the lease for, then that node id and term until the outcome is seen.
        self.handing_over = ""
        self.handed_over: tuple[str, int] | None = None
        self.resigned = False  # the release due ends the term as "resigned"
        # The last term this node held until its deadline passed without a renewal: its
        # history record is to say "lost the backend" (sent with the next request).
        self.lost_term = 0
        self.stopping = False
        self.barred = ""  # why this node may not ask for a lease it does not hold (candidacy.py)
        # Moves on resign and stop: answers to requests sent before then win nothing.
        self.epoch = 0
        self.last_error: str | None = None
        self.lost: str | None = None  # why the lease is gone for good (LeaseLost)
        self.ready = False
        # The leader's view of the last lease it was derived from: every /leader answer
        # derives the view, and a lease (immutable) yields the same one until replaced.
        self._leading: tuple[Lease, View] | None = None

    # ---- answers ----

    def view(self, now: float) -> View:
        lease = self.lease
        term = lease.term if lease is not None else 0
        if self.stopping:
            return View(Role.STOPPED, None, term, "shutting down")
        if self.leading(now) and lease is not None:
            cached = self._leading  # the same View while the same lease is held
            if cached is not None and cached[0] is lease:
                return cached[1]
            return self._leading_view(lease)
        # Fail closed: knowledge older than one ttl, or our own lapsed hold, names nobody.
        stale = lease is None or now - self.seen_at >= self.timing.ttl
        if stale or self.held_term is not None or self.lost is not None:
            return View(Role.UNKNOWN, None, term, self._why_not_leading(now))
        assert lease is not None
        expired = lease.expires_in is not None and now >= self.seen_at + lease.expires_in
        if lease.holder is None or lease.held_by(self.candidate) or expired:
            return View(Role.FOLLOWER, None, term, self._why_not_leading(now))
        info = LeaderInfo(lease.holder, lease.address, lease.term, lease.acquired_at)
        return View(Role.FOLLOWER, info, term, self._why_not_leading(now))

    def _leading_view(self, lease: Lease) -> View:
        me = self.candidate
        info = LeaderInfo(me.node_id, me.address, lease.term, lease.acquired_at)
        view = View(Role.LEADER, info, lease.term, f"holding the lease, term {lease.term}")
        self._leading = (lease, view)
        return view

    def leading(self, now: float) -> bool:
        return self.held_term is not None and not self.stopping and now < self.deadline

    def valid_for(self, now: float) -> float | None:
        """Seconds left before the self-fence deadline while leading; None otherwise."""
        return self.deadline - now if self.leading(now) else None

    def sentence(self, previous: View | None, view: View, now: float) -> str:
        """The one sentence that tells a change of view (Patroni's habit: a value, tested)."""
        name = self.name
        if view.role is Role.LEADER:
            if previous and previous.role is Role.LEADER and previous.term != view.term:
                return f"acquired election {name}, term {view.term}; term {previous.term} ended"
            return f"acquired election {name}, term {view.term}"
        if previous is not None and previous.role is Role.LEADER:
            # The term this node held, not the new holder's, and why it ended.
            return f"stepping down from election {name}, term {previous.term}: {view.why}"
        if view.role is Role.STOPPED:
            return f"stopped campaigning in election {name}"
        if view.role is Role.UNKNOWN:
            why = self.last_error or "no answer from the backend yet"
            return f"leader of election {name} unknown: {why}"
        if view.leader is not None:
            return f"following {view.leader.node_id} in election {name}, term {view.term}"
        return f"election {name} has no leader"

    # ---- what to send, and when ----

    def campaigning(self, now: float) -> bool:
        allowed = not self.barred or self.held_term is not None  # a leader's policy decides
        return not self.stopping and now >= self.cooldown_until and allowed

    def request(self, now: float) -> Request:
        campaigning = self.campaigning(now) and self.in_doubt.term is None
        wait = self.follow_period(now) if campaigning and self.held_term is None else 0.0
        ask = Ask(
            self.name,
            self.candidate,
            self.timing.ttl,
            self.request_timeout(now),
            wait,
            takeover=self.takeover(now),
            min_term=self.high_water + 1,
            lost_term=self.lost_term,
        )
        return Request(campaigning=campaigning, ask=ask, epoch=self.epoch)

    def takeover(self, now: float) -> str:
        """The version of an unreleased lease this node may take over now: one it has seen
        unchanged for one ttl on its own clock; "" for none (docs/algorithm.md, "Holders,
        instances and taking over")."""
        if self.watched is None or now < self.watched_since + self.timing.ttl:
            return ""
        return self.watched[3]

    def request_timeout(self, now: float) -> float:
        if self.held_term is not None and self.deadline > now:
            return max(MIN_DELAY, self.deadline - now)
        return self.timing.renew_interval

    def follow_period(self, now: float) -> float:
        """How long a follower may sleep (or block in the backend) before its next round.

        A free lease: renew_interval (its release or acquisition wakes us anyway). Another
        holder's: retry_interval, to see each renewal within it (so a dead holder is taken
        over within ttl + retry_interval), and never past the moment it may be taken over:
        both the backend's expiry and our own ttl of watching.
        """
        lease = self.lease
        if lease is not None and lease.reserved_against(self.candidate):
            # Reserved for another node: ask again the moment the reservation ends.
            ends_in = lease.reserved_in - (now - self.seen_at)
            return max(MIN_DELAY, min(self.timing.retry_interval, ends_in))
        if lease is None or lease.holder is None:
            return self.timing.renew_interval
        may_take_in = self.watched_since + self.timing.ttl - now
        if lease.expires_in is not None:
            may_take_in = max(may_take_in, lease.expires_in - (now - self.seen_at))
        return max(MIN_DELAY, min(self.timing.retry_interval, may_take_in))

    def next_round(self, request: Request, t_send: float, now: float) -> float:
        """Seconds from ``now`` to the next round, after an answer to ``request``."""
        if self.held_term is not None:
            return max(MIN_DELAY, t_send + self.timing.renew_interval - now)
        if self.release_due is not None:
            return MIN_DELAY  # an acquisition this node may not keep: release it now
        lease = self.lease
        free = lease is None or (
            lease.holder is None and not lease.reserved_against(self.candidate)
        )
        # Watching a holder needs no jitter; taking over after it (one round) is a CAS.
        delay = self.jittered(self.follow_period(now)) if free else self.follow_period(now)
        if not ((request.campaigning and request.epoch == self.epoch) or self.barred):
            delay = min(delay, self.cooldown_until - now)
        return max(MIN_DELAY, delay)

    def retry_delay(self) -> float:
        """After a failed request: retry_interval, with a bounded jitter."""
        return self.jittered(self.timing.retry_interval)

    def jittered(self, delay: float) -> float:
        return delay + min(delay * 0.2, self.timing.retry_interval / 2) * self.jitter()

    def next_boundary(self, now: float) -> float:
        """The next instant at which the view changes with no request at all."""
        edges = [self.deadline, self.seen_at + self.timing.ttl]
        if self.lease is not None and self.lease.expires_in is not None:
            edges.append(self.seen_at + self.lease.expires_in)
        return min((t for t in edges if t > now), default=math.inf)

    # ---- what happened ----

    def resign(self, now: float, cooldown: float, to: str = "") -> None:
        """Stop leading now, release at the next round (reserved for node id ``to`` if
        given and this node leads), campaign again after cooldown."""
        self.epoch += 1
        self.cooldown, self.cooldown_until = cooldown, now + cooldown
        if self.held_term is not None:
            self.release_due, self.held_term = self.held_term, None
            self.handing_over = to
            self.resigned = True

    def reservation_due(self) -> str:
        """The node id the hand-over's release reserves the lease for ("" for none)."""
        to, self.handing_over = self.handing_over, ""
        return to

    def on_reserved(self, to: str, term: int) -> None:
        """The release reserved the lease for ``to``: watch whether it takes it."""
        self.handed_over = (to, term)

    def stop(self) -> None:
        self.stopping = True
        self.epoch += 1

    def on_lease(self, lease: Lease, request: Request, t_send: float, now: float) -> list[Note]:
        """An answer to ``request`` (sent at ``t_send``) arrived at ``now``. A cached one is
        news, not the request's own answer: it may end a hold, never start or extend one, nor
        tell what an unanswered request did (docs/algorithm.md, "Only a request's own answer
        makes a leader")."""
        high_water, self.high_water = self.high_water, max(self.high_water, lease.term)
        self.lease, self.seen_at, self.ready = lease, t_send, True
        notes = self._watch(lease, now) + self._hand_over_outcome(lease)
        if lease.cached:
            self.held_term = self.held_term if lease.held_by(self.candidate) else None
            return notes
        self.last_error, self.lost, self.maybe_held = None, None, False
        # A resign or stop that came while the request was in flight wins over its answer.
        in_doubt = self.in_doubt.still_mine(lease, self.candidate)  # never led on again
        campaigning = request.campaigning and request.epoch == self.epoch and not in_doubt
        mine = lease.held_by(self.candidate)
        self._note_lost(request, lease, t_send)
        if mine and lease.term != self.last_held_term and lease.term <= high_water:
            notes.append(self._refuse(lease, high_water))
        elif mine and campaigning:
            # A renewal that answers after a pause yields a deadline already past: fenced.
            self.held_term, self.last_held_term = lease.term, lease.term
            self.deadline, self.renewed_at = self._deadline_after(t_send, lease), t_send
        elif mine or in_doubt:  # won after resign/stop, or still named by a term in doubt
            self.release_due, self.held_term = lease.term, None
        else:
            self.held_term = None
        return notes

    def on_grant(self, lease: Lease, t_send: float, now: float) -> bool | None:
        """A release handed this process ``lease``, whose expiry counts from a heartbeat of
        this process sent at ``t_send`` (docs/algorithm.md, "One-write hand-over"). True: it
        leads; False: it may not lead now and gives the lease back; None: only a round can
        tell (old news, a term already seen, an answer lost in flight, a heartbeat too old)."""
        fresh = lease.held_by(self.candidate) and lease.term > self.high_water
        fresh = fresh and not self.in_doubt.still_mine(lease, self.candidate)
        if not fresh or self.held_term is not None or self.maybe_held:
            return None
        if not self.campaigning(now):
            self.release_due = lease.term  # cooling down or stopping: pass it on at once
            return False
        deadline = self._deadline_after(t_send, lease)
        if deadline <= now:
            return None
        self.high_water, self.lease = lease.term, lease
        self.watched, self.watched_since = None, math.inf
        self.held_term, self.last_held_term = lease.term, lease.term
        self.deadline, self.renewed_at = deadline, t_send
        return True

    def on_abandoned(self, request: Request) -> None:
        """A request got no answer: it may have taken the lease, or a new term."""
        self.maybe_held = self.maybe_held or request.campaigning

    def on_failure(self, exc: BaseException, request: Request) -> None:
        self.on_abandoned(request)
        self.last_error = str(exc) or "request timed out"
        self.ready = True  # "unknown" is an answer: readiness never waits for the backend
        if isinstance(exc, LeaseLost):
            self.on_lost(self.last_error)

    def on_lost(self, why: str) -> None:
        """Whatever this node held is gone (LeaseLost): no wait for the deadline."""
        if self.held_term is not None:
            self.lost, self.held_term = why, None

    def term_to_release(self) -> int | None:
        """The term the hand-over releases: one given back, held, or last seen held."""
        term = self.release_due if self.release_due is not None else self.held_term
        if term is None and self.lease is not None and self.lease.held_by(self.candidate):
            term = self.lease.term
        self.release_due, self.held_term = None, None
        return term

    # ---- helpers ----

    def _note_lost(self, request: Request, lease: Lease, t_send: float) -> None:
        """A hold whose deadline passed before this answer, and that it does not continue,
        was lost for want of the backend; a request that said so was heard."""
        if request.ask.lost_term == self.lost_term:
            self.lost_term = 0
        held = self.held_term
        continued = lease.held_by(self.candidate) and lease.term == held
        if held is not None and t_send >= self.deadline and not continued:
            self.lost_term = held

    def _deadline_after(self, t_send: float, lease: Lease) -> float:
        """docs/algorithm.md, "Self-fencing", trusting no more than the backend granted."""
        timing = self.timing
        granted = timing.ttl if lease.expires_in is None else min(timing.ttl, lease.expires_in)
        return t_send + granted * (1.0 - timing.clock_drift) - timing.safety_margin

    def _why_not_leading(self, now: float) -> str:
        lease = self.lease
        if self.lost is not None:
            return self.lost
        if self.held_term is not None and now >= self.deadline:
            return f"no successful renewal for {now - self.renewed_at:.1f}s, deadline passed"
        if self.barred and self.held_term is None:
            return f"not campaigning: {self.barred}"
        to = self.handing_over or (self.handed_over[0] if self.handed_over else "")
        if to and (now < self.cooldown_until or self.release_due is not None):
            return f"resigned, handing over to {to}"
        if now < self.cooldown_until or self.release_due is not None:
            return f"resigned, not campaigning for {self.cooldown:g}s"
        if lease is not None and lease.holder is not None and not lease.held_by(self.candidate):
            return f"{lease.holder or 'an unknown holder'} holds the lease (term {lease.term})"
        if lease is not None and lease.reserved_against(self.candidate):
            return f"the lease is reserved for {lease.reserved_for} (a hand-over)"
        if self.last_error is not None:
            return self.last_error
        return "the lease is free"

    def _watch(self, lease: Lease, now: float) -> list[Note]:
        """Follow another holder's lease: the takeover clock restarts at every change."""
        if lease.holder is None or lease.held_by(self.candidate):
            self.watched, self.watched_since = None, math.inf
            return []
        notes = []
        if lease.held_by_twin(self.candidate) and lease.instance not in self.twins:
            self.twins.add(lease.instance)
            self.duplicates_seen += 1
            notes.append(duplicate_note(self.name, lease, self.candidate.instance))
        key = (lease.holder, lease.instance, lease.term, lease.version)
        if key != self.watched:
            self.watched, self.watched_since = key, now
        return notes

    def _hand_over_outcome(self, lease: Lease) -> list[Note]:
        """Once the reservation this node made is over: did its node take the lease?"""
        if self.handed_over is None or lease.reserved_for == self.handed_over[0]:
            return []
        (to, term), self.handed_over = self.handed_over, None
        fields = {"election": self.name, "term": lease.term, "holder": lease.holder, "to": to}
        if lease.holder == to:
            sentence = f"handed election {self.name} over to {to}, term {lease.term}"
            return [Note(logging.INFO, Event.HANDED_OVER, sentence, fields)]
        now_held = f"{lease.holder} holds it" if lease.holder else "any standby may take it"
        sentence = (
            f"election {self.name}: {to} did not take the lease reserved for it after term "
            f"{term} (not running, not a candidate, or cooling down); {now_held}"
        )
        return [Note(logging.WARNING, Event.HANDOVER_LAPSED, sentence, fields)]

    def _refuse(self, lease: Lease, high_water: int) -> Note:
        """The backend granted a term this node has already seen: it lost acknowledged
        writes (an asynchronous commit, a restored backup). Lead with none of it."""
        self.terms_refused += 1
        self.release_due, self.held_term = lease.term, None
        return refused_note(self.name, lease, high_water)
