"""Settle the heap once the daemon is ready: collect, freeze, and give free pages back.

Start-up (imports, the first requests) allocates and frees about 1 MB of short-lived
objects that glibc's allocator keeps mapped in the middle of the heap, where no automatic
trim reaches. Once the daemon is ready, one collection frees start-up's cycles, and
``gc.freeze()`` moves the objects that remain (modules, classes, the app: they live as long
as the daemon) out of the collector's generations, so no later full collection walks them
again; then one ``malloc_trim(0)`` returns the free pages (docs/benchmarks.md, "Start-up
and idle memory"). Where there is no malloc_trim (musl), that last step does nothing.
"""

from __future__ import annotations

import ctypes
import gc


def settle() -> bool:
    """Collect, freeze the survivors, and trim; False where the C library cannot trim."""
    gc.collect()
    gc.freeze()
    return trim()


def trim() -> bool:
    """Return free heap pages to the system; False where the C library cannot."""
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim(0)
    return True
