"""What the running managers hold, shared with the API: the RuntimeStore protocol.

A manager records itself (heartbeat: one row, O(1) writes), its entries (written only when they
change) and the outcome of every slot (batched, in the same step as the enqueue). The API reads
the same store, so ``GET /entries`` shows managers in other processes too.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol

# held: options.overlap hold kept the slot while the schedule's previous task runs (the slot
# then gets a second run: enqueued once that task finished, or skipped).
# resent: published again with the same task id because the broker never confirmed an earlier
# publish of the slot (AMQP); the workers may see it twice, and nothing is lost.
RunStatus = Literal["enqueued", "duplicate", "resent", "skipped", "failed", "held"]
# Outcomes that settle a slot for good: a takeover or catch-up never sends it (or an earlier one)
# again. A failed or held slot is not settled: the next leader may still send it within grace.
SETTLED = frozenset({"enqueued", "duplicate", "resent", "skipped"})
SENT = frozenset({"enqueued", "duplicate", "resent"})


@dataclass(frozen=True, slots=True)
class ManagerInfo:
    manager_id: str
    hostname: str
    pid: int
    version: str
    started_at: datetime


@dataclass(frozen=True, slots=True)
class ManagerStatus:
    """A heartbeat's content."""

    heartbeat_at: datetime
    is_leader: bool
    last_sync_at: datetime | None
    last_sync_error: str | None
    entry_count: int


@dataclass(frozen=True, slots=True)
class EntryRecord:
    """An entry as published: ``status`` ``active`` (registered) or ``error`` (row rejected)."""

    entry_id: str
    schedule_key: str
    name: str | None
    content_hash: str
    status: Literal["active", "error"]
    registered_at: datetime
    spec: str | None = None
    timezone: str | None = None
    anchor: datetime | None = None
    task_type: str | None = None
    queue: str | None = None
    last_error: str | None = None
    held_slot: datetime | None = None  # options.overlap hold: the slot held now
    previous_task_id: str | None = None  # options.overlap: the schedule's last task...
    previous_task_state: str | None = None  # ...as last seen (queued, running, finished, ...)
    # An error record of a row whose last good version this manager keeps running: since when.
    last_good_since: datetime | None = None


@dataclass(slots=True)  # not frozen: built once per slot, and frozen __init__ is slow
class RunRecord:
    """The outcome of one slot."""

    schedule_key: str
    name: str
    slot: datetime
    status: RunStatus
    at: datetime
    message_id: str | None = None
    error: str | None = None
    # Why a slot was skipped or held, for the metrics: late, overlap (skip policy), overlap
    # (held), overlap-replaced, overlap-expired, overlap-released, overlap-timeout.
    reason: str | None = None


@dataclass(slots=True)
class StateRecord:
    """Per-schedule runtime state as stored (see ``pm_schedule_state``)."""

    schedule_key: str
    name: str
    last_slot_at: datetime | None = None
    last_done_at: datetime | None = None  # the latest settled slot (see SETTLED)
    last_enqueued_at: datetime | None = None
    last_message_id: str | None = None
    last_status: str | None = None
    last_error: str | None = None
    counts: dict[str, int] = field(default_factory=dict)


class RuntimeStore(Protocol):
    """Where managers publish what they hold. Every method may raise on I/O errors; the manager
    logs and retries, it never stops scheduling because the store is unreachable."""

    async def register_manager(self, info: ManagerInfo, status: ManagerStatus) -> None:
        """Create or replace the manager's row and drop any entries it had published before."""
        ...

    async def heartbeat(self, manager_id: str, status: ManagerStatus) -> None:
        """Update the manager's row (one write)."""
        ...

    async def apply_entries(
        self, manager_id: str, upserts: Sequence[EntryRecord], removed: Sequence[str]
    ) -> None:
        """Insert or replace ``upserts`` and delete the entry ids in ``removed``."""
        ...

    async def record_runs(self, runs: Sequence[RunRecord]) -> None:
        """Fold a batch of slot outcomes into per-schedule state (one round trip per batch)."""
        ...

    async def unregister_manager(self, manager_id: str) -> None:
        """Remove the manager and its entries (clean shutdown)."""
        ...

    async def get_state(self, schedule_keys: Iterable[str]) -> dict[str, StateRecord]:
        """Stored runtime state of the given schedules (absent keys are missing)."""
        ...

    async def settled_after(self, since: datetime) -> dict[str, datetime]:
        """The latest settled slot of every schedule whose latest settled slot is after
        ``since``, by schedule key (what a takeover must not send again)."""
        ...

    async def reap(self, older_than: datetime) -> int:
        """Remove managers whose heartbeat is older than ``older_than`` (and their entries)."""
        ...


class MemoryRuntimeStore:
    """In-process RuntimeStore for code and tests."""

    def __init__(self) -> None:
        self.managers: dict[str, tuple[ManagerInfo, ManagerStatus]] = {}
        self.entries: dict[str, dict[str, EntryRecord]] = {}
        self.state: dict[str, StateRecord] = {}
        self.runs: list[RunRecord] = []

    async def register_manager(self, info: ManagerInfo, status: ManagerStatus) -> None:
        self.managers[info.manager_id] = (info, status)
        self.entries[info.manager_id] = {}

    async def heartbeat(self, manager_id: str, status: ManagerStatus) -> None:
        info, _ = self.managers[manager_id]
        self.managers[manager_id] = (info, status)

    async def apply_entries(
        self, manager_id: str, upserts: Sequence[EntryRecord], removed: Sequence[str]
    ) -> None:
        table = self.entries.setdefault(manager_id, {})
        for entry_id in removed:
            table.pop(entry_id, None)
        for rec in upserts:
            table[rec.entry_id] = rec

    async def record_runs(self, runs: Sequence[RunRecord]) -> None:
        self.runs.extend(runs)
        for run in runs:
            fold_run(self.state.setdefault(run.schedule_key, StateRecord(run.schedule_key, run.name)), run)

    async def unregister_manager(self, manager_id: str) -> None:
        self.managers.pop(manager_id, None)
        self.entries.pop(manager_id, None)

    async def get_state(self, schedule_keys: Iterable[str]) -> dict[str, StateRecord]:
        return {k: self.state[k] for k in schedule_keys if k in self.state}

    async def settled_after(self, since: datetime) -> dict[str, datetime]:
        return {
            k: st.last_done_at
            for k, st in self.state.items()
            if st.last_done_at is not None and st.last_done_at > since
        }

    async def reap(self, older_than: datetime) -> int:
        dead = [m for m, (_, st) in self.managers.items() if st.heartbeat_at < older_than]
        for manager_id in dead:
            await self.unregister_manager(manager_id)
        return len(dead)


def fold_run(state: StateRecord, run: RunRecord) -> StateRecord:
    """Apply one run to a state record (shared by every store so they agree)."""
    state.name = run.name
    state.counts[run.status] = state.counts.get(run.status, 0) + 1
    state.last_status = run.status
    if run.status in SETTLED and (state.last_done_at is None or run.slot > state.last_done_at):
        state.last_done_at = run.slot
    if run.status in SENT:
        if state.last_slot_at is None or run.slot >= state.last_slot_at:
            state.last_slot_at = run.slot
            state.last_enqueued_at = run.at
            state.last_message_id = run.message_id
        state.last_error = None
    elif run.status == "failed":
        state.last_error = run.error
    return state
