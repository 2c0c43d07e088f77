"""TEMPORARY SHIM — replaced by the real engine (issue 2). Interface only; do not rely on semantics."""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from periodic_manager.errors import ConfigError

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class CronError(ConfigError):
    def __init__(self, field: str, code: str, detail: str = "") -> None:
        super().__init__(field, f"{code}: {detail}" if detail else code)
        self.code = code


class Schedule:
    def __init__(self, expr: str, tz: str, anchor: datetime | None) -> None:
        self.expr, self.tz = expr, tz
        try:
            self.zone = ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError):
            raise CronError("timezone", "unknown-zone", tz) from None
        m = re.fullmatch(r"@every\s+(\d+)([smh])", expr.strip(), re.I)
        self.period = None
        if m:
            self.period = timedelta(seconds=int(m[1]) * {"s": 1, "m": 60, "h": 3600}[m[2].lower()])
            self.anchor = anchor or EPOCH
        else:
            try:
                CronSim(expr, datetime(2000, 1, 1))
            except CronSimError as exc:
                raise CronError("expression", "syntax", str(exc)) from None

    def next_after(self, after: datetime) -> datetime:
        if self.period is not None:
            k = (after - self.anchor) // self.period + 1
            return (self.anchor + k * self.period).astimezone(UTC)
        return next(iter(CronSim(self.expr, after.astimezone(self.zone)))).astimezone(UTC)

    def next_fires(self, after: datetime, n: int = 1) -> list[datetime]:
        out = []
        for _ in range(n):
            after = self.next_after(after)
            out.append(after)
        return out


@functools.lru_cache(maxsize=65536)
def parse(expr: str, tz: str = "UTC", anchor: datetime | None = None) -> Schedule:
    return Schedule(expr, tz, anchor)


def next_fires(expr: str, after: datetime, n: int = 1, tz: str = "UTC", anchor: datetime | None = None) -> list[datetime]:
    return parse(expr, tz, anchor).next_fires(after, n)
