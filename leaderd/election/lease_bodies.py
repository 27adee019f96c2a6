"""A leader's answer for each millisecond of lease it shows, without encoding it anew.

While this node leads, its answer changes every millisecond (``valid_for_ms``) and in
nothing else until the view or the revision moves. The bytes on either side of that number
are kept, and each millisecond only the number is written between them: a full encoding
(a status, its dict, the JSON) costs about 8 us, which at 10,000 answers a second was most
of a microsecond per answer.
"""

from __future__ import annotations

_FIELD = b'"valid_for_ms":'


class LeaseBodies:
    """The last leader's answer, split around its ``valid_for_ms``."""

    def __init__(self) -> None:
        self._shows: object = None  # what the answer shows besides the time left
        self._head = b""
        self._tail = b""

    def body(self, shows: object, left_ms: int) -> bytes | None:
        """The answer showing ``shows`` and ``left_ms``, if one showing ``shows`` was
        learnt; else None (encode it, then learn() it)."""
        if shows != self._shows:
            return None
        return b"%s%d%s" % (self._head, left_ms, self._tail)

    def learn(self, shows: object, left_ms: int, body: bytes) -> None:
        """Keep ``body``, the full encoding showing ``shows`` and ``left_ms``. A JSON string
        cannot hold the field's unescaped quotes, so the field is found only where it is."""
        number = _FIELD + b"%d" % left_ms
        at = body.rfind(number)
        if at < 0 or body.count(_FIELD) != 1:  # not a leader's answer: keep nothing
            self._shows = None
            return
        self._head = body[: at + len(_FIELD)]
        self._tail = body[at + len(number) :]
        self._shows = shows
