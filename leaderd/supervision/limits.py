"""The open-file limit: lifted for the daemon's watchers; a supervised child's keeper gives
the command the original one back (``ORIGINAL``).

Every /watch client holds a socket; a soft limit of 1,024 would leave the rest of 10,000
watchers unaccepted, silently.
"""

from __future__ import annotations

import contextlib
import resource

# What the daemon was started with (read at import, before anything raises it).
ORIGINAL = resource.getrlimit(resource.RLIMIT_NOFILE)


def raise_open_files() -> int:
    """Lift the soft limit to the hard one; return the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
