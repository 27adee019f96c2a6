"""The line protocol of `run -- COMMAND`'s supervision: one "WORD ARGS..." line per message.

leaderd, the keeper (keeper.py) and the init of the command's PID namespace, the
last guard (guard.py), say nothing else to each other. Standard library only, like
the keeper and the guard that import it.
"""

from __future__ import annotations

# leaderd -> keeper, on the lifeline (its EOF: leaderd is gone); keeper -> guard, DEADLINE
# only, on the guard's orders pipe (its EOF: the keeper is gone).
DEADLINE = "deadline"  # deadline T: the lease's self-fence deadline, CLOCK_BOOTTIME seconds
STOP = "stop"  # SIGTERM the whole tree now, SIGKILL at min(now + grace, deadline)
SIGNAL = "signal"  # signal N: pass signal N on to COMMAND itself
# keeper -> leaderd, on the report pipe; the guard tells the keeper PID, ERROR and EXIT.
SKIPPED = "skipped"  # skipped MODE WHY: a better containment that is not available here
CONTAINED = "contained"  # contained MODE HANDLE: pidns INIT_PID | cgroup PATH | session GUARD_PID
PID = "pid"  # pid N: COMMAND runs, as host pid N
ERROR = "error"  # error WHY: COMMAND could not be started
EXIT = "exit"  # exit CODE WHY: the whole tree is gone; CODE as in subprocess (-N: signal N)
# EXIT's WHY: COMMAND exited by itself; leaderd said stop; the deadline came and leaderd had
# said nothing; leaderd died; the containment died under the keeper (an internal failure);
# the deadline came and neither leaderd nor the keeper had acted: the guard ended the tree.
# The guard's own EXIT says only the first or the last.
EXITED, STOPPED, DEADLINE_PASSED, ORPHANED, LOST = "exited", "stop", "deadline", "orphaned", "lost"
GUARDED = "guard"


def encode(word: str, *args: object) -> bytes:
    return " ".join([word, *map(str, args)]).encode() + b"\n"


class Lines:
    """Messages out of the bytes a pipe delivers: (word, rest of the line) pairs."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[tuple[str, str]]:
        *lines, self._buffer = (self._buffer + data).split(b"\n")
        return [_split(line.decode(errors="replace")) for line in lines]


def _split(line: str) -> tuple[str, str]:
    word, _, rest = line.partition(" ")
    return word, rest
