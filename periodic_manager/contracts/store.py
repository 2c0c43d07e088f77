"""What managers publish: the :class:`RuntimeStore` (managers, entries, the outcome of every slot)
and the values it keeps; a heartbeat another statement may carry (:class:`BeatStore`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, NamedTuple, Protocol, get_args, runtime_checkable

from periodic_manager.contracts.targets import EnqueueResult, EnqueueStatus

__all__ = [
    "RunStatus",
    "SlotReason",
    "SLOT_REASONS",
    "SETTLED",
    "SENT",
    "ManagerInfo",
    "ManagerStatus",
    "EntryRecord",
    "RunRecord",
    "StateRecord",
    "StateReader",
    "RuntimeStore",
    "BeatStore",
    "CarriedBeat",
    "ServerClock",
    "BeatCarrier",
    "run_status",
    "failure_reason",
]


# held: options.overlap hold kept the slot while the schedule's previous task runs (the slot
# then gets a second run: enqueued once that task finished, or skipped).
# resent: published again with the same task id because the broker never confirmed an earlier
# publish of the slot (AMQP); the workers may see it twice, and nothing is lost.
RunStatus = Literal["enqueued", "duplicate", "resent", "skipped", "failed", "held"]

# Why a slot was skipped, held or failed, or sent the way it was: one closed list, the ``reason``
# label of the metrics, the run history's ``reason`` and the counts of a schedule's stats.
#   late               more than grace (or its catch-up window) after its instant: skipped
#   excluded           on a date of a calendar of options.exclude: skipped
#   unrecorded         options.max_runs: the previous run is not recorded yet (store down)
#   overlap            the previous task is still queued or running: skipped (options.overlap
#                      skip), or held until it finishes (hold)
#   overlap-replaced   a held slot that a newer slot replaced: skipped
#   overlap-expired    a held slot past its window: skipped
#   overlap-released   a held slot sent once the previous task finished
#   overlap-timeout    sent although the previous task still ran after options.overlap_timeout
#   refused            the target refused the task for good (not retried)
#   failed             the target failed the task (it was not retried)
#   target-down        the target failed every attempt until the slot's grace ended
SlotReason = Literal[
    "late",
    "excluded",
    "unrecorded",
    "overlap",
    "overlap-replaced",
    "overlap-expired",
    "overlap-released",
    "overlap-timeout",
    "refused",
    "failed",
    "target-down",
]
SLOT_REASONS: tuple[SlotReason, ...] = get_args(SlotReason)


# Outcomes that settle a slot for good: a takeover or catch-up never sends it (or an earlier one)
# again. A failed or held slot is not settled: the next leader may still send it within grace.
SETTLED = frozenset({"enqueued", "duplicate", "resent", "skipped"})
SENT = frozenset({"enqueued", "duplicate", "resent"})


@dataclass(frozen=True, slots=True)
class ManagerInfo:
    """Who a manager is. Read back from a store, a value the store holds but cannot be read
    (written there with SQL) is None."""

    manager_id: str
    hostname: str
    pid: int | None
    version: str
    started_at: datetime | None


@dataclass(frozen=True, slots=True)
class ManagerStatus:
    """A heartbeat's content (read back from a store: ``entry_count`` None when unreadable)."""

    heartbeat_at: datetime
    is_leader: bool
    last_sync_at: datetime | None
    last_sync_error: str | None
    entry_count: int | None
    # Whether this manager does the work done once for every manager (pruning run history by
    # age, the change history): with PM_COORDINATION=partitions, the holder of partition 0 only.
    # Not stored (read back: True).
    shared_work: bool = True
    # Why this manager holds no work: its targets do not answer their pings (None: it may hold
    # work; runtime.target_health). Stored in pm_managers.target_down.
    target_down: str | None = None
    # Seconds this manager's wall clock is ahead of the database's (None: not measured).
    clock_offset_s: float | None = None


class EntryRecord(NamedTuple):
    """An entry as published: ``status`` ``active`` (registered) or ``error`` (row rejected).
    Read back from a store, ``status`` is the stored text and an unreadable instant is None.

    A tuple (a cold start builds one per entry): built positionally it costs a tenth of a
    dataclass built with keywords, and a store copies it as the row it is (fields in this
    order, after the manager id) without converting it."""

    entry_id: str
    schedule_key: str
    name: str | None
    content_hash: str
    status: str
    registered_at: datetime | None
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
    # Why it was skipped, held or failed, or sent the way it was (SlotReason).
    reason: SlotReason | None = None
    # The schedule has options.max_runs: a sent slot is counted in StateRecord.runs.
    limited: bool = False


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
    # Distinct slots of a limited schedule (options.max_runs) recorded sent after the settled
    # slot of their time: each counts once, however often it is found duplicate.
    runs: int = 0

    def fold(self, run: RunRecord) -> StateRecord:
        """Apply one run (every store folds with this, so they agree)."""
        self.name = run.name
        self.counts[run.status] = self.counts.get(run.status, 0) + 1
        self.last_status = run.status
        if (
            run.limited
            and run.status in SENT
            and (self.last_done_at is None or run.slot > self.last_done_at)
        ):
            self.runs += 1
        if run.status in SETTLED and (self.last_done_at is None or run.slot > self.last_done_at):
            self.last_done_at = run.slot
        if run.status in SENT:
            if self.last_slot_at is None or run.slot >= self.last_slot_at:
                self.last_slot_at = run.slot
                self.last_enqueued_at = run.at
                self.last_message_id = run.message_id
            self.last_error = None
        elif run.status == "failed":
            self.last_error = run.error
        return self


# Reads what the store records of the schedules with these keys (the ones it has).
StateReader = Callable[[Iterable[str]], Awaitable[Mapping[str, StateRecord]]]


class RuntimeStore(Protocol):
    """Where managers publish what they hold. Every method may raise on I/O errors; the manager
    logs and retries, it never stops scheduling because the store is unreachable."""

    async def register_manager(self, info: ManagerInfo, status: ManagerStatus) -> None:
        """Create or replace the manager's row and drop any entries it had published before."""
        ...

    async def heartbeat(
        self, manager_id: str, status: ManagerStatus, *, reap_before: datetime | None = None
    ) -> int:
        """Update the manager's row (one write); with ``reap_before``, also count the other
        managers whose heartbeat is older (a beat at rest costs one round of statements, not
        two). The count is returned: the caller removes them apart, with :meth:`reap` (a dead
        manager's entries never weigh on a heartbeat). A store with a history to prune does
        that in :meth:`BeatStore.beaten`, which the heartbeat runs apart after the beat."""
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

    async def reap(self, older_than: datetime, *, silence: timedelta | None = None) -> int:
        """Remove managers whose heartbeat is older than ``older_than`` (and their entries); a
        store on a database with a clock of its own (PostgreSQL) judges by ``silence`` instead
        when given: silent for longer than it on the database's clock."""
        ...


@runtime_checkable
class BeatStore(Protocol):
    """A runtime store whose heartbeat another statement of the manager can write (PostgreSQL:
    the lease round's, ``PM_COORDINATION=partitions``), so a manager at rest makes one round
    trip per round instead of two (``db.managers.beat_ctes`` is that heartbeat's SQL)."""

    @property
    def carries_beat(self) -> bool:
        """Whether this store's heartbeat can be carried (its database is PostgreSQL)."""
        ...

    def beat_values(
        self, manager_id: str, status: ManagerStatus, reap_before: datetime | None
    ) -> tuple[Any, ...]:
        """The carried heartbeat's parameters, in the order of its SQL's."""
        ...

    async def beaten(self, status: ManagerStatus) -> None:
        """What follows a heartbeat written, by :meth:`RuntimeStore.heartbeat` or carried (the
        history prune, when due): the heartbeat runs it in a task of its own, so neither its
        next beat nor a round carrying one waits for it."""
        ...

    def prune_due(self, now: datetime) -> bool:
        """Whether :meth:`beaten` at ``now`` has work to do."""
        ...


class CarriedBeat(Protocol):
    """A manager's heartbeat, written by a statement of another part (a lease round)."""

    def values(self) -> tuple[Any, ...] | None:
        """The heartbeat's parameters now (:meth:`BeatStore.beat_values`); None: write none
        this time (the heartbeat writes its own)."""
        ...

    def written(self, beaten: bool, dead: int) -> None:
        """The statement carrying the values ran; ``beaten`` False: the manager's row was gone;
        ``dead``: how many other managers are due for reaping (removed apart)."""
        ...

    def missed(self) -> None:
        """The statement that was to carry the heartbeat failed."""
        ...


@runtime_checkable
class ServerClock(Protocol):
    """A store whose database has a clock of its own, which managers' clocks are measured
    against (``runtime.clock_offset``)."""

    async def server_now(self) -> datetime | None:
        """The database's now() (None: it has no clock of its own, e.g. SQLite's file)."""
        ...


@runtime_checkable
class BeatCarrier(Protocol):
    """A part whose periodic statement can carry the manager's heartbeat (partition leases)."""

    @property
    def interval(self) -> float:
        """Seconds between two of its statements."""
        ...

    def carry(self, beat: CarriedBeat) -> None:
        """Write ``beat`` in each of its statements from now on."""
        ...


def run_status(status: EnqueueStatus) -> RunStatus:
    """The run a target's answer becomes (``busy`` has none of its own: the overlap guard records
    the slot skipped or held)."""
    if status == "busy":
        raise ValueError("a busy answer is recorded as skipped or held")
    return status


def failure_reason(result: EnqueueResult) -> SlotReason | None:
    """The reason of a target's answer that failed a task: ``refused`` for good, else ``failed``
    (None: it did not fail)."""
    if result.status != "failed":
        return None
    return "refused" if result.permanent else "failed"
