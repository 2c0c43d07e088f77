"""When the cyclic garbage collector may run.

A manager holds hundreds of thousands of long-lived objects. A full collection walks all of them:
0.3-0.5 s with 100,000 schedules on this project's machines, long enough to make a burst late or
to threaten the leader's proof of leadership. So collection is paused while a sync builds entries
or a burst is staged and sent, and the survivors of a large sync are frozen (moved where the
collector never looks again). Pauses nest (a sync may yield to a burst and the other way round);
collection resumes when the last one ends. Objects freed by reference counting, which is nearly
everything here, are freed at once either way.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
from collections.abc import Iterator

_depth = 0
_was_enabled = True


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No cyclic collection inside (nesting allowed)."""
    global _depth, _was_enabled
    if _depth == 0:
        _was_enabled = gc.isenabled()
        gc.disable()
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _was_enabled:
            gc.enable()


def freeze() -> None:
    """Move every object alive now out of the collector's sight.

    Collecting the young generation first would walk the new objects once more (the very cost
    this avoids): a large sync's rare cyclic garbage is frozen with them instead.
    """
    gc.freeze()


def _malloc_trim() -> object:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to give back this way
        return None


_TRIM = _malloc_trim()


def release() -> None:
    """Give memory freed by a large piece of work (a sync, a publish) back to the system.

    Records and parameter sets above the small-object allocator's size go through malloc,
    which keeps what they freed for the process; without this a cold start of 100,000 entries
    kept ~100 bytes per schedule it no longer used. A few milliseconds; glibc only."""
    gc.collect()  # cheap after a freeze: only what is younger is walked
    if _TRIM is not None:
        _TRIM(0)  # type: ignore[operator]
