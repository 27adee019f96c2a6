"""What an election answers, and how a change of it is published: each answer derives the
role from the clock at the moment it is asked, and a change of role, leader or term is a new
revision for the watchers and one logged sentence. The loop that contests the election is
engine.py's."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from .. import held_logs, jsonio
from ..backends.base import Candidate
from ..backends.records import Member
from ..clock import Clock
from ..events import Event, extra
from .heartbeats import Heartbeats
from .history import History
from .lease_bodies import LeaseBodies
from .members import Members, members_of
from .state import ElectionState
from .status import ElectionStatus, Role
from .timing import Timing
from .values import Note, View
from .watchers import ChangeListener, Watchers

log = logging.getLogger("leaderd.engine")
# Read per answer: a module global, as Python 3.11 looks an enum member up slowly (0.1 us).
_LEADER = Role.LEADER


@dataclass(frozen=True, slots=True)
class EncodedStatus:
    """An ElectionStatus as its JSON answer, and what that answer shows."""

    # The view, the revision, the milliseconds left (None: a published status, not judged
    # by encoded_status()).
    shown: tuple[View, int, int | None] | None
    role: Role
    revision: int
    body: bytes


class ElectionAnswers:
    """One election's state as this node knows it, and the answers read from it."""

    def __init__(
        self,
        name: str,
        candidate: Candidate,
        timing: Timing,
        clock: Clock,
        jitter: Callable[[], float],
    ) -> None:
        self.name = name
        self.candidate = candidate
        self.timing = timing
        self.state = ElectionState(name, candidate, timing, jitter)
        self.last_contact: dt.datetime | None = None
        self._clock = clock
        self._turn_due = math.inf
        # The last published view: each change of its key is a new revision.
        self._published: View | None = None
        self._watchers = Watchers(name, self._clock.wall())
        # The members the last answer listed, and when its request was sent.
        self._heard: tuple[Member, ...] = ()
        self._heard_at = -math.inf
        self._heartbeats = Heartbeats()  # when our answered requests were heard, and sent
        self._history = History(name, (), None)
        self._history_of: tuple[str | None, str, int] | None = None  # the lease it was read at
        # --elected-hook-gates: a term is answered "leader" only once this says it may be.
        self.gate: Callable[[int], bool] | None = None
        self._encoded: EncodedStatus | None = None  # the last encoded_status()
        self._lease_bodies = LeaseBodies()  # a leader's answer, per millisecond left
        # The last published status a long poll answered, encoded once for all of them.
        self._published_encoded: tuple[ElectionStatus | None, EncodedStatus | None] = (None, None)
        self._refresh(self._clock.now())

    def status(self) -> ElectionStatus:
        now = self._clock.now()
        return self._snapshot(self._refresh(now), now)

    def encoded_status(self) -> EncodedStatus:
        """status() as JSON, judged at this instant exactly as status() is. The bytes are
        reused while nothing they show changed: the view, the revision, and the time left
        in the whole milliseconds the answer shows (the hot path of every /leader answer)."""
        now = self._clock.now()
        view = self._refresh(now)
        # A "leader" view is derived only while leading: the time left is the deadline's.
        left = int((self.state.deadline - now) * 1000) if view.role is _LEADER else None
        shown = (view, self._watchers.revision, left)
        encoded = self._encoded
        if encoded is None or encoded.shown != shown:
            encoded = self._encoded = self._encode_shown(view, now, shown)
        return encoded

    def members(self) -> Members:
        """The members with their roles now (docs/api.md, "Members")."""
        now = self._clock.now()
        view, lease = self._refresh(now), self.state.lease
        holder = None
        if view.leader is not None and lease is not None:
            me = self.candidate
            holder = (me.node_id, me.instance) if view.role is Role.LEADER else None
            holder = holder or (view.leader.node_id, lease.instance)
        elapsed = now - self._heard_at
        return members_of(
            self.name, self.candidate.node_id, view.term, self._heard, elapsed, holder
        )

    def history(self) -> History:
        """The history as last read, newest first (docs/api.md, "History")."""
        return self._history

    def lease_left(self) -> float | None:
        """Seconds before the self-fence deadline while leading; None otherwise."""
        now = self._clock.now()
        self._refresh(now)
        return self.state.valid_for(now)

    def lease_deadline(self) -> tuple[int, float] | None:
        """(term, self-fence deadline on CLOCK_BOOTTIME) while leading; None otherwise."""
        now = self._clock.now()
        view = self._refresh(now)
        return (view.term, self.state.deadline) if view.role is Role.LEADER else None

    def held_deadline(self) -> tuple[int, float] | None:
        """(term, deadline) while this node holds the lease, whether or not the gate lets it
        answer "leader" yet (the elected hook that opens it needs to know)."""
        now = self._clock.now()
        self._refresh(now)
        lease = self.state.lease
        leading = self.state.leading(now) and lease is not None
        return (lease.term, self.state.deadline) if leading and lease is not None else None

    def health(self) -> str | None:
        """None while the loop turns on time; else why it looks stalled."""
        late = self._clock.now() - self._turn_due
        return f"election {self.name} loop stalled for {late:.1f}s" if late > 0 else None

    @property
    def ready(self) -> bool:
        """The first attempt is over, whatever its outcome ("unknown" is an answer)."""
        return self.state.ready

    @property
    def last_error(self) -> str | None:
        return self.state.last_error

    @property
    def duplicates_seen(self) -> int:
        return self.state.duplicates_seen

    @property
    def terms_refused(self) -> int:
        return self.state.terms_refused

    @property
    def watchers(self) -> int:
        return self._watchers.count

    def add_listener(self, listener: ChangeListener) -> None:
        """Call ``listener`` synchronously with the new status on every revision."""
        self._watchers.add_listener(listener)

    async def wait_for_change(self, revision: int | None, timeout: float) -> ElectionStatus:
        """Long poll: the status once its revision differs from ``revision`` (or the
        next change when None), or the current status after ``timeout`` seconds."""
        return await self._watchers.wait(self.status, _same, revision, timeout)

    def wait_for_answer(
        self, revision: int | None, timeout: float
    ) -> Coroutine[Any, Any, EncodedStatus]:
        """wait_for_change as its JSON answer: thousands of long polls woken by one change
        share one encoding of it, and a "leader" answer is judged anew for each of them
        (encoded_status(), whose bytes are reused while they show the same). The wait
        itself, with no coroutine around it: one frame less to resume per woken poll."""
        return self._watchers.wait(self.encoded_status, self._encode_published, revision, timeout)

    def end_long_polls(self) -> None:
        """Answer every waiting long poll now, with the current answer (shutdown)."""
        self._watchers.end_waits()

    def _encode_published(self, status: ElectionStatus) -> EncodedStatus:
        """The encoding of a published status, found by identity (hashing it for each of
        thousands of waiters costs more)."""
        last, encoded = self._published_encoded
        if status is not last or encoded is None:
            encoded = _encode(status, None)
            self._published_encoded = (status, encoded)
        return encoded

    def stream(self) -> contextlib.AbstractContextManager[asyncio.Queue[ElectionStatus]]:
        """A queue that receives the current status, then one status per change."""
        return self._watchers.stream(self.status())

    def _encode_shown(
        self, view: View, now: float, shown: tuple[View, int, int | None]
    ) -> EncodedStatus:
        """The answer showing ``shown``; a leader's from the last one's bytes when only
        the milliseconds left moved."""
        view, revision, left = shown
        if left is not None and (body := self._lease_bodies.body((view, revision), left)):
            return EncodedStatus(shown, view.role, revision, body)
        encoded = _encode(self._snapshot(view, now), shown)
        if left is not None:
            self._lease_bodies.learn((view, revision), left, encoded.body)
        return encoded

    def _snapshot(self, view: View, now: float) -> ElectionStatus:
        return ElectionStatus(
            election=self.name,
            node_id=self.candidate.node_id,
            role=view.role,
            leader=view.leader,
            term=view.term,
            ttl=self.timing.ttl,
            valid_for=self.state.valid_for(now) if view.role is Role.LEADER else None,
            revision=self._watchers.revision,
            changed_at=self._watchers.changed_at,
        )

    def _refresh(self, now: float) -> View:
        """Derive the view; on a change of role, leader or term, publish a new revision."""
        view = gated = self.state.view(now)
        if self.gate is not None and view.role is _LEADER and not self.gate(view.term):
            why = f"won election {self.name}, term {view.term}: answering leader once the "
            view = View(Role.UNKNOWN, None, view.term, why + "elected hook succeeds")
        previous = self._published
        if view is previous or (previous is not None and view.key == previous.key):
            return view
        self._published = view
        self._watchers.next_revision(self._clock.wall())
        sentence = view.why if view is not gated else self.state.sentence(previous, view, now)
        level = logging.DEBUG if previous is None else logging.INFO
        holder = view.leader.node_id if view.leader else None
        fields = extra(Event(view.role.value), election=self.name, term=view.term, holder=holder)
        # The long polls this publish wakes answer before the line is written (held_logs.py).
        handing_over = held_logs.holding()  # then the hand-over's own release writes it
        held_logs.hold()
        held_logs.log(log, level, sentence, extra=fields)
        self._watchers.publish(self._snapshot(view, now))
        if not handing_over:
            held_logs.release_soon()
        return view

    def _log_notes(self, notes: list[Note]) -> None:
        for note in notes:
            log.log(note.level, note.sentence, extra=extra(note.event, **note.fields))


def _encode(status: ElectionStatus, shown: tuple[View, int, int | None] | None) -> EncodedStatus:
    return EncodedStatus(shown, status.role, status.revision, jsonio.dumps(status.to_dict()))


def _same(status: ElectionStatus) -> ElectionStatus:
    return status
