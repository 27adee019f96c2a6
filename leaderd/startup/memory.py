"""Give the heap's free pages back to the system once the daemon is ready (glibc).

Start-up (imports, the first requests) allocates and frees about 1 MB of short-lived
objects that glibc's allocator keeps mapped in the middle of the heap, where no automatic
trim reaches. One ``malloc_trim(0)`` once the daemon is ready returns them
(docs/benchmarks.md, "Start-up and idle memory"). Where there is no malloc_trim (musl), it
does nothing.
"""

from __future__ import annotations

import ctypes


def trim() -> bool:
    """Return free heap pages to the system; False where the C library cannot."""
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim(0)
    return True
