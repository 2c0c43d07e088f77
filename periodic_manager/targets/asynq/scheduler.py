"""What asynq's own tools read of a scheduler (``asynq cron ls``, ``asynq cron history``,
asynqmon's Schedulers page), written as asynq's ``Scheduler`` writes it (v0.24 to v0.26,
``internal/rdb/rdb.go`` ``WriteSchedulerEntries`` and ``RecordSchedulerEnqueueEvent``)::

    asynq:schedulers                      ZSET  each scheduler's entries key, scored by its expiry
                                                (Unix s); the tools read the keys not expired
    asynq:schedulers:{<manager id>}       LIST  one SchedulerEntry per registered entry, expiring
                                                with its score (refreshed every round)
    asynq:scheduler_history:<entry id>    ZSET  SchedulerEnqueueEvent per task enqueued, scored
                                                by the enqueue (Unix s), the newest 1000 kept

Each manager is one scheduler (its manager id). The entry id is the schedule's name, the same on
every manager and across edits, so an entry's history is its schedule's. An entry's spec carries
its zone as robfig's cron (asynq's parser) spells it, ``CRON_TZ=<zone> <spec>``, unless UTC; its
options are asynq's own option strings (``Queue("mail")``, ``MaxRetry(5)``, ``Timeout(1m30s)``,
``Unique(1h0m0s)``, ``Retention(24h0m0s)``); its previous enqueue is the last slot this manager
handled, or Go's zero time (asynq's "never").
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from periodic_manager.contracts import AnnouncedEntry
from periodic_manager.targets.asynq.message import extra_seconds, payload_bytes

ALL_SCHEDULERS = "asynq:schedulers"
ANNOUNCE_EVERY_S = 5.0  # asynq v0.24's heartbeat (v0.26: 10 s by default)
ANNOUNCE_TTL_S = 20  # an announcement outlives three missed rounds
ANNOUNCE_MAX = 10_000  # entries per manager: a list for people to read
MAX_EVENTS = 1000  # asynq's maxEvents: the history kept per entry
GO_ZERO_TIME_S = -62_135_596_800  # Go's time.Time{} (year 1) in Unix seconds: "never"
_UNITS = ((3600, "h"), (60, "m"))


def entries_key(manager_id: str) -> str:
    return f"asynq:schedulers:{{{manager_id}}}"


def history_key(entry_id: str) -> str:
    return f"asynq:scheduler_history:{entry_id}"


def go_duration(seconds: float) -> str:
    """``seconds`` as Go's ``time.Duration.String()`` prints it (``1h0m0s``, ``1m30s``,
    ``1.5s``, ``500ms``)."""
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    if ns < 1_000_000_000:
        for size, unit in ((1_000_000, "ms"), (1_000, "µs"), (1, "ns")):
            if ns >= size:
                whole, part = divmod(ns, size)
                frac = f"{part:0{len(str(size)) - 1}d}".rstrip("0") if part else ""
                return f"{whole}{'.' + frac if frac else ''}{unit}"
    whole_s, part = divmod(ns, 1_000_000_000)
    text = ""
    started = False
    for size, unit in _UNITS:
        count, whole_s = divmod(whole_s, size)
        if count or started:
            text += f"{count}{unit}"
            started = True
    frac = f"{part:09d}".rstrip("0") if part else ""
    return f"{text}{whole_s}{'.' + frac if frac else ''}s"


def option_strings(options: Mapping[str, Any], queue: str) -> list[str]:
    """The options an asynq scheduler entry would list for these schedule options."""
    out = [f'Queue("{queue}")']
    if options.get("max_retry") is not None:
        out.append(f"MaxRetry({options['max_retry']})")
    for key, name in (("timeout", "Timeout"), ("unique_ttl", "Unique")):
        if options.get(key) is not None:
            out.append(f"{name}({go_duration(float(options[key]))})")
    try:
        retention = extra_seconds(options, "retention")
    except ValueError:
        retention = None
    if retention is not None:
        out.append(f"Retention({go_duration(retention)})")
    return out


def _set_time(stamp: Any, at: datetime | None) -> None:
    if at is None:
        stamp.seconds = GO_ZERO_TIME_S
        return
    micros = round(at.timestamp() * 1_000_000)
    stamp.seconds, rest = divmod(micros, 1_000_000)
    stamp.nanos = rest * 1000


def entry_bytes(entry: AnnouncedEntry, message_class: Any) -> bytes:
    """``entry`` as asynq's ``SchedulerEntry``, encoded."""
    spec = entry.spec if entry.timezone == "UTC" else f"CRON_TZ={entry.timezone} {entry.spec}"
    queue = str(entry.options.get("queue", "default"))
    message = message_class(
        id=entry.name,
        spec=spec,
        task_type=entry.task_type,
        task_payload=payload_bytes(entry.payload_json),
        enqueue_options=option_strings(entry.options, queue),
    )
    _set_time(message.next_enqueue_time, entry.next_at)
    _set_time(message.prev_enqueue_time, entry.prev_at)
    data: bytes = message.SerializeToString()
    return data


def event_bytes(task_id: str, at: datetime, message_class: Any) -> bytes:
    """One enqueue as asynq's ``SchedulerEnqueueEvent``, encoded."""
    message = message_class(task_id=task_id)
    _set_time(message.enqueue_time, at)
    data: bytes = message.SerializeToString()
    return data
