"""When the cyclic garbage collector may run: a policy for a process that holds a large schedule.

A manager holds hundreds of thousands of long-lived objects. A full collection walks all of them,
which at a hundred thousand schedules takes long enough to make a burst late or to threaten the
leader's proof of leadership. So collection is paused while a sync builds entries
or a burst is staged and sent, and the survivors of a large sync are frozen (moved where the
collector never looks again). Pauses nest (a sync may yield to a burst and the other way round);
collection resumes when the last one ends. Objects freed by reference counting, which is nearly
everything here, are freed at once either way.

This is the process's business, not the library's: nothing here acts until the process
:func:`enable` s it (the ``periodic-manager`` commands that run a manager do; so do the
benchmarks). An application that embeds a manager keeps its own collector settings unless it
asks for these.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator

_enabled = False
_depth = 0
_was_enabled = True
_trim: Callable[[int], object] | None = None


def enable() -> None:
    """Apply the policy in this process from now on (idempotent)."""
    global _enabled, _trim
    if _enabled:
        return
    _enabled = True
    _trim = _malloc_trim()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No cyclic collection inside (nesting allowed); nothing without the policy."""
    global _depth, _was_enabled
    if not _enabled:
        yield
        return
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
    """Move every object alive now out of the collector's sight (with the policy).

    Collecting the young generation first would walk the new objects once more (the very cost
    this avoids): a large sync's rare cyclic garbage is frozen with them instead.
    """
    if _enabled:
        gc.freeze()


def settle() -> None:
    """Once a process has started its work (with the policy): collect what start-up left
    behind, freeze the survivors (imported modules, the first sync's entries) so that no later
    collection walks them again, and give the freed memory back. At rest the collector then only
    ever looks at the few objects a heartbeat or a sync makes."""
    if not _enabled:
        return
    gc.collect()
    gc.freeze()
    release()


def release() -> None:
    """Give memory freed by a large piece of work (a sync, a publish) back to the system (with
    the policy).

    Records and parameter sets above the small-object allocator's size go through malloc,
    which keeps what they freed for the process: without this a cold start keeps, per schedule,
    memory it no longer uses (bench/lean.py measures it). glibc only."""
    if not _enabled:
        return
    gc.collect()  # cheap after a freeze: only what is younger is walked
    if _trim is not None:
        _trim(0)


def _malloc_trim() -> Callable[[int], object] | None:
    import ctypes

    try:
        # The symbols already loaded into the process (libc among them): no search of the
        # library path, which ctypes.util.find_library does by running ldconfig (~10 ms).
        trim: Callable[[int], object] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to give back this way
        return None
    return trim
