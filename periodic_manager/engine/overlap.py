"""``options.overlap`` in the scheduler: what a slot does while its schedule's previous task is
still queued or running.

The target decides "finished" (it has the completion signal) and answers ``busy`` for a slot it
did not send because of it. Here that answer becomes:

- ``skip``: the slot is recorded ``skipped`` (error ``overlap: ...``); the entry moves on.
- ``hold``: the slot is recorded ``held`` and kept, one per schedule; every ``tick`` (1 s by
  default) while something is held and this scheduler leads, the held slots go through the normal
  send path again, and the target sends each as soon as the previous task has finished. A newer
  slot that is busy too replaces the held one (the older is recorded ``skipped``, reason
  ``overlap-replaced``), and a held slot older than its schedule's window (grace, or the catch-up
  window of ``fire_once``) is dropped as ``skipped`` (``overlap-expired``). So a long run shifts
  the next start and never replays what it missed.

A previous task that timed out (older than ``options.overlap_timeout``) counted as finished: the
slot is sent and its run carries a warning (reason ``overlap-timeout``).

State lives in side dicts keyed by schedule ident (``config.ident``: the row id as an int),
only for schedules that use skip or hold:
``held`` (the held slots) and ``seen`` (the schedule's last task and its state as last seen,
which managers publish for ``/entries`` and ``GET /schedules/{id}``). Schedules on the default
``allow`` cost nothing here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from periodic_manager.contracts import (
    QUEUED,
    SENT,
    EnqueueResult,
    RunRecord,
    RunStatus,
    SlotReason,
    failure_reason,
    run_status,
)
from periodic_manager.schedules.jitter import offset_of
from periodic_manager.schedules.rules import overlap_policy

if TYPE_CHECKING:
    from periodic_manager.engine.entry import ScheduledEntry

log = logging.getLogger(__name__)

HOLD_TICK_S = 1.0  # how often held slots are tried again while any is held


@dataclass(slots=True)
class Held:
    """A slot held while its schedule's previous task runs."""

    entry: ScheduledEntry
    slot: datetime


@dataclass(frozen=True, slots=True)
class View:
    """What a manager publishes about a schedule with overlap skip or hold."""

    held_slot: datetime | None
    previous_task_id: str | None
    previous_task_state: str | None


def _describe(res: EnqueueResult) -> str:
    prev = res.previous
    if prev is None or prev.task_id is None:
        return "the previous task is unfinished"
    return f"the previous task {prev.task_id} is {prev.state}"


class OverlapGuard:
    """Turns ``busy`` answers into skipped and held runs, keeps held slots, says when to retry."""

    def __init__(
        self,
        *,
        tick_s: float = HOLD_TICK_S,
        window: Callable[[ScheduledEntry], timedelta] = lambda entry: timedelta(0),
        changed: Callable[[ScheduledEntry], None] | None = None,
    ) -> None:
        self.tick = timedelta(seconds=tick_s)
        self.window = window  # how long after its slot an entry's task may still be sent
        self.held: dict[int | str, Held] = {}
        self.seen: dict[int | str, tuple[str | None, str | None]] = {}
        self._next_tick_at: datetime | None = None
        # Called with an entry whose published view changed (the manager publishes it).
        self.changed = changed

    # -- visibility ---------------------------------------------------------------------------

    def view(self, key: int | str) -> View | None:
        held = self.held.get(key)
        seen = self.seen.get(key)
        if held is None and seen is None:
            return None
        task_id, state = seen if seen is not None else (None, None)
        return View(held.slot if held is not None else None, task_id, state)

    # -- outcomes -----------------------------------------------------------------------------

    def outcome(
        self, entry: ScheduledEntry, slot: datetime, res: EnqueueResult, at: datetime
    ) -> list[RunRecord]:
        """The runs of one result the dispatcher hands over: one a target decided about the
        previous task (``previous`` set, or ``busy``), or one of a schedule with a held slot.
        No run for a held slot still busy."""
        key = entry.ident
        before = self.view(key)
        runs = (
            self._busy(entry, slot, res, at)
            if res.status == "busy"
            else self._sent(entry, slot, res, at)
        )
        prev = res.previous
        if res.status == "busy" and prev is not None:
            self.seen[key] = (prev.task_id, prev.state)
        elif res.status in SENT and overlap_policy(entry.config.options) != "allow":
            self.seen[key] = (res.task.id, QUEUED)
        if self.changed is not None and self.view(key) != before:
            self.changed(entry)
        return runs

    def _busy(
        self, entry: ScheduledEntry, slot: datetime, res: EnqueueResult, at: datetime
    ) -> list[RunRecord]:
        key, name = entry.ident, entry.config.name
        why = _describe(res)
        held = self.held.get(key)
        if overlap_policy(entry.config.options) != "hold":
            if held is not None and held.slot == slot:
                del self.held[key]  # held under hold, sent again under another policy
            return [_run(entry, slot, "skipped", at, f"overlap: {why}", "overlap")]
        if held is not None and held.slot == slot:
            held.entry = entry  # still waiting (the schedule may have been edited meanwhile)
            return []
        if held is not None and held.slot > slot:
            return [
                _run(
                    entry,
                    slot,
                    "skipped",
                    at,
                    f"overlap: the slot {held.slot.isoformat()} is held instead",
                    "overlap-replaced",
                )
            ]
        runs = []
        if held is not None:
            runs.append(_replaced(held, slot, at))
        elif not self.held:
            self._next_tick_at = at + self.tick  # the first held slot: the next try in a tick
        self.held[key] = Held(entry, slot)
        log.info(
            "holding slot %s of %s: %s",
            slot.isoformat(),
            name,
            why,
            extra={"schedule": name, "slot": slot.isoformat()},
        )
        runs.append(_run(entry, slot, "held", at, f"overlap: {why}", "overlap"))
        return runs

    def _sent(
        self, entry: ScheduledEntry, slot: datetime, res: EnqueueResult, at: datetime
    ) -> list[RunRecord]:
        """An enqueued, duplicate or failed result of a schedule that uses (or used) overlap."""
        key = entry.ident
        reason: SlotReason | None = None
        held = self.held.get(key)
        runs: list[RunRecord] = []
        if held is not None and res.status in SENT:
            if held.slot == slot:
                del self.held[key]
                reason = "overlap-released"
            elif held.slot < slot:  # a newer slot got through: the held one is not replayed
                del self.held[key]
                runs.append(_replaced(held, slot, at))
        error = res.error
        prev = res.previous
        if res.status in ("enqueued", "resent") and prev is not None and prev.timed_out:
            reason = "overlap-timeout"
            timeout = entry.config.options.get("overlap_timeout")
            error = (
                f"overlap-timeout: the previous task {prev.task_id} was still {prev.state} after "
                f"overlap_timeout ({timeout} s); counted as finished"
            )
            log.warning(
                "%s: slot %s sent although %s",
                entry.config.name,
                slot.isoformat(),
                error,
                extra={"schedule": entry.config.name, "slot": slot.isoformat()},
            )
        reason = reason or failure_reason(res)
        runs.append(_run(entry, slot, run_status(res.status), at, error, reason, res.message_id))
        return runs

    # -- held slots ---------------------------------------------------------------------------

    def wake_at(self) -> datetime | None:
        """When held slots are to be tried again (None: nothing held)."""
        return self._next_tick_at if self.held else None

    def take_due(
        self, now: datetime, current: Callable[[int | str], ScheduledEntry | None]
    ) -> tuple[list[RunRecord], dict[datetime, list[ScheduledEntry]]] | None:
        """At a tick: the held slots to send again by slot (each with its schedule's current
        entry), and the skipped runs of those past their window. None before the tick."""
        if not self.held:
            self._next_tick_at = None
            return None
        if self._next_tick_at is not None and now < self._next_tick_at:
            return None
        self._next_tick_at = now + self.tick
        expired: list[RunRecord] = []
        retry: dict[datetime, list[ScheduledEntry]] = {}
        for key, held in list(self.held.items()):
            entry = current(key)
            if entry is None:  # the schedule is gone: nothing to send, nothing to record
                del self.held[key]
                continue
            window = self.window(entry) + offset_of(entry, held.slot)  # from the send instant
            if now - held.slot > window:
                del self.held[key]
                late = (now - held.slot).total_seconds()
                expired.append(
                    _run(
                        entry,
                        held.slot,
                        "skipped",
                        now,
                        f"overlap: held {late:.3f} s, past its window of "
                        f"{window.total_seconds():g} s",
                        "overlap-expired",
                    )
                )
                if self.changed is not None:
                    self.changed(entry)
                continue
            held.entry = entry
            retry.setdefault(held.slot, []).append(entry)
        return expired, retry

    def drop(self, entries: list[ScheduledEntry], slot: datetime) -> None:
        """Forget held slots whose send was given up (recorded failed by the dispatcher)."""
        for entry in entries:
            held = self.held.get(entry.ident)
            if held is not None and held.slot == slot:
                del self.held[entry.ident]

    def forget(self, key: int | str) -> None:
        """A schedule removed, or no longer using overlap: nothing of it is kept."""
        self.held.pop(key, None)
        self.seen.pop(key, None)

    def clear(self) -> int:
        """Drop every held slot (leadership lost, stopping): the leader that takes over sends
        them again, or holds them itself. Returns how many there were."""
        count = len(self.held)
        if count:
            log.info("dropping %d held slot(s): no longer sending", count)
        self.held.clear()
        self._next_tick_at = None
        return count


def _replaced(held: Held, slot: datetime, at: datetime) -> RunRecord:
    """The run of a held slot that a newer ``slot`` replaced (it is skipped, never replayed)."""
    return _run(
        held.entry,
        held.slot,
        "skipped",
        at,
        f"overlap: replaced by the slot {slot.isoformat()}",
        "overlap-replaced",
    )


def _run(
    entry: ScheduledEntry,
    slot: datetime,
    status: RunStatus,
    at: datetime,
    error: str | None,
    reason: SlotReason | None,
    message_id: str | None = None,
) -> RunRecord:
    return RunRecord(
        entry.key,
        entry.config.name,
        slot,
        status,
        at,
        message_id,
        error,
        reason=reason,
        limited=entry.runs_left is not None,
    )
