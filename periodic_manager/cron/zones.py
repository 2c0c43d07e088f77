"""UTC offsets of an IANA zone as constant-offset spans, using zoneinfo's public API only.

zoneinfo answers "what is the offset at this instant" but does not list transitions.
A :class:`Zone` finds them by probing the offset every ``PROBE_S`` seconds and
bisecting every change down to the exact second (tzdata transitions are whole
seconds). Results are cached per fixed-size chunk of time, so each stretch of the
timeline is probed once per process.

This is exact as long as two offset changes are never closer than ``PROBE_S``
(otherwise a change and its reversal could hide between two probes). The closest
pair in tzdata is about four days apart (Africa/Freetown, 1940s);
``tests/cron/test_zone_data.py`` checks the installed data against this bound.

Instants are integer seconds since the Unix epoch (UTC); offsets are integer seconds.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from periodic_manager.cron.errors import CronError

PROBE_S = 24 * 3600
CHUNK_S = 64 * PROBE_S
#: How long a transition can still matter after it happened: the largest gap or
#: fold (24 h, Pacific/Apia 2011) bounds both shifted runs and second passes.
LOOKBACK_S = 2 * 86_400
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Probes stay two days inside datetime's range so local times never overflow.
_S_MIN = -62_135_596_800 + 2 * 86_400  # 0001-01-03T00:00Z
_S_MAX = 253_402_300_799 - 2 * 86_400  # 9999-12-29T23:59:59Z
_FAR = 10**15
_CHUNKS_MAX = 20_000
_AHEAD_CHUNKS = 6

# tzdata defines these as a fixed offset forever; no probing needed.
_FIXED = re.compile(
    r"(?:Etc/)?(?:UTC|UCT|Universal|Zulu|Greenwich|GMT(?:[+-]?0)?)|Etc/GMT[+-](?:[0-9]|1[0-4])"
)


class Zone:
    """One IANA zone: ``span(s)`` gives the constant-offset stretch around instant ``s``."""

    __slots__ = ("name", "info", "_fixed", "_chunks", "_starts", "_memo", "_memo2")

    def __init__(self, name: str) -> None:
        if name == "localtime":  # the host's zone file, not an IANA name: never the host's zone
            raise CronError("timezone", "unknown-zone", "'localtime' is not an IANA zone name")
        try:
            info = ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError, TypeError, OSError):
            raise CronError(
                "timezone", "unknown-zone", f"{name!r} is not an IANA zone name"
            ) from None
        self.name = name
        self.info = info
        self._chunks: dict[int, tuple[int, list[int], list[int]]] = {}
        self._fixed = _FIXED.fullmatch(name) is not None
        off = self.offset_at(0)
        # The last span as (valid from, lo, hi, off, prev, clean), valid on [from, hi).
        self._memo = (-_FAR, -_FAR, _FAR, off, off, -_FAR) if self._fixed else (0, 0, 0, 0, 0, 0)
        self._memo2 = self._memo
        self._starts: dict[int, tuple[int, int, int, int, int, int]] = {}

    def offset_at(self, s: int) -> int:
        """UTC offset in seconds at instant ``s`` (clamped to datetime's range)."""
        s = min(max(s, _S_MIN), _S_MAX)
        off = (_EPOCH + timedelta(seconds=s)).astimezone(self.info).utcoffset()
        assert off is not None
        return off.days * 86_400 + off.seconds

    def span(self, s: int) -> tuple[int, int, int, int, int, int]:
        """``(valid_from, lo, hi, off, prev, clean)`` for instant ``s``.

        The offset is ``off`` on ``[lo, hi)`` and ``s`` is in it. If ``prev != off``,
        ``lo`` is a real transition from offset ``prev``. If ``prev == off``, no
        transition happened in ``[lo, s]`` and ``lo <= s - LOOKBACK_S``. ``hi`` is the
        next transition or an instant up to which the offset is known to stay ``off``.
        From ``clean`` on, no earlier transition has any effect (no shifted runs, no
        second pass): plain wall-clock arithmetic with ``off`` is exact until ``hi``.
        The same answer holds for every instant in ``[valid_from, hi)``.
        """
        memo = self._memo
        if memo[0] <= s < memo[2]:
            return memo
        # Queries alternate between two neighbouring spans around a transition ("now"
        # just before it, the answer just after), so keep the previous one too.
        other = self._memo2
        if other[0] <= s < other[2]:
            self._memo, self._memo2 = other, memo
            return other
        got = self._starts.get(s)
        if got is None:
            got = self._compute(s)
            if s == got[1] or s % CHUNK_S == 0:
                # Span starts are where a long search enters the next span: worth keeping.
                if len(self._starts) >= _CHUNKS_MAX:
                    self._starts.clear()
                self._starts[s] = got
        self._memo, self._memo2 = got, memo
        return got

    def _compute(self, s: int) -> tuple[int, int, int, int, int, int]:
        c = s // CHUNK_S
        base, trans, offs = self._chunk(c - 1)
        _, t1, o1 = self._chunk(c)
        _, t2, o2 = self._chunk(c + 1)
        trans = trans + t1 + t2
        offs = offs + o1 + o2
        i = bisect_right(trans, s)
        hi = trans[i] if i < len(trans) else self._next_transition(c + 2)
        if i:
            lo, off = trans[i - 1], offs[i - 1]
            prev = offs[i - 2] if i >= 2 else base
            return (lo, lo, hi, off, prev, lo + abs(off - prev))
        lo = (c - 1) * CHUNK_S
        return (lo + LOOKBACK_S, lo, hi, base, base, lo + LOOKBACK_S)

    def _next_transition(self, c: int) -> int:
        """The first transition at or after chunk ``c``'s start, or a bound ~1 year on.

        Looking ahead keeps a whole DST period in one memoised span; the bound keeps
        zones without DST from probing far ahead for nothing.
        """
        for k in range(c, c + _AHEAD_CHUNKS):
            trans = self._chunk(k)[1]
            if trans:
                return trans[0]
        return (c + _AHEAD_CHUNKS) * CHUNK_S

    def _chunk(self, c: int) -> tuple[int, list[int], list[int]]:
        """(offset at the chunk start, transitions in (start, end], offsets after each)."""
        got = self._chunks.get(c)
        if got is not None:
            return got
        start = c * CHUNK_S
        probes = [start + i * PROBE_S for i in range(CHUNK_S // PROBE_S + 1)]
        values = [self.offset_at(p) for p in probes]
        trans: list[int] = []
        offs: list[int] = []
        for i in range(len(probes) - 1):
            if values[i] != values[i + 1]:
                trans.append(self._bisect(probes[i], probes[i + 1], values[i + 1]))
                offs.append(values[i + 1])
        got = (values[0], trans, offs)
        if len(self._chunks) >= _CHUNKS_MAX:
            self._chunks.clear()
        self._chunks[c] = got
        return got

    def _bisect(self, lo: int, hi: int, new: int) -> int:
        """The first second in ``(lo, hi]`` whose offset is ``new`` (the transition)."""
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.offset_at(mid) == new:
                hi = mid
            else:
                lo = mid
        return hi
