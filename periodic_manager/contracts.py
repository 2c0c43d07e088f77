"""Every seam of periodic_manager: a Protocol with its contract written on it, and the values that
cross it.

The engine and the runtime depend on these and on nothing behind them; an adapter (the database,
Redis, Celery, arq, PostgreSQL's advisory locks and LISTEN) implements them. A capability beyond
the required methods is a Protocol of its own (:class:`IncrementalProvider`,
:class:`StagedTarget`, :class:`Pingable`, :class:`Forgetful`), checked once where the parts are
put together, never probed where it is used.

::

    ConfigProvider ──configs──► manager ──tasks──► Target
        (IncrementalProvider)      │                  (StagedTarget, Pingable, Forgetful)
                                   ├──records──► RuntimeStore (LastGoodStore)
                                   ├──asks─────► Leadership
                                   └──woken by─► ChangeSignal
    everything reads time from a Clock; the API drives an in-process manager as a ManagerHandle
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.schedules.partition import every_partition
from periodic_manager.schedules.rules import canonical_json

# -- time ------------------------------------------------------------------------------------------


class Clock(Protocol):
    """Source of time for the scheduler and the manager."""

    def now(self) -> datetime:
        """The current instant, an aware UTC datetime (the wall clock: slots are judged by it)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that only moves forward, at the pace of real time, whatever the
        wall clock does (a step back or forward, a skew): leases, their trust and every wait on
        another holder's expiry are measured on it. Only differences of two readings mean
        anything."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return after ``seconds`` of this clock's time have passed (cancellable)."""
        ...

    async def sleep_until(self, instant: datetime) -> None:
        """Return once this clock reaches ``instant`` (cancellable). The remaining time is
        measured when the timer is armed, so work queued before the sleeper first runs does not
        make it late."""
        ...

    async def wait_until(self, event: asyncio.Event, instant: datetime) -> bool:
        """Wait for ``event`` until this clock reaches ``instant`` at most; True when the event
        was set (cancellable). The real clock waits without a task of its own."""
        ...


# -- schedules in: providers -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RowError:
    """A row the provider could not turn into a config (bad spec, zone, payload, options...)."""

    schedule_id: int | str
    name: str | None
    content_hash: str  # hash of the raw row content, so an error is logged once per (row, content)
    field: str
    reason: str
    code: str = "value_error"  # ConfigError.code: "too-large", "out-of-range", "never-fires", ...
    revision: int | None = None  # the row's revision when judged (a database row's), if known

    @property
    def message(self) -> str:
        return f"{self.field}: {self.reason}"


@dataclass(frozen=True, slots=True)
class ProviderSnapshot:
    """Everything a sync needs: the usable enabled configs and the rows that were rejected."""

    configs: Sequence[PeriodicTaskConfig]
    errors: Sequence[RowError] = ()
    revision: int | None = None  # the source's change counter when read (incremental providers)


@dataclass(frozen=True, slots=True)
class ChangeSet:
    """What changed since a revision: rows written (enabled and valid, or rejected) and the keys of
    rows deleted or disabled. ``full`` asks for a full read instead (e.g. after a TRUNCATE)."""

    revision: int
    configs: Sequence[PeriodicTaskConfig] = ()
    errors: Sequence[RowError] = ()
    removed: Sequence[str] = ()
    full: bool = False


class ConfigProvider(Protocol):
    """Source of schedules. One method: return every enabled, valid schedule right now.

    Raises ProviderError when the source cannot be read (the manager then keeps its entries).
    """

    async def get_configs(self) -> ProviderSnapshot: ...


# The config a manager holds for a row id (None: none), as a provider may reuse it.
Known = Callable[[int], "PeriodicTaskConfig | None"]


@runtime_checkable
class IncrementalProvider(ConfigProvider, Protocol):
    """A provider whose cost follows change: it says what changed since an earlier read, and
    reuses what the manager already holds instead of building it again."""

    async def get_changes(self, since: int) -> ChangeSet | None:
        """None when nothing changed since ``since`` (one cheap query); else the changes."""
        ...

    async def prune_tombstones(self, older_than: datetime) -> int:
        """Forget deletions older than ``older_than`` (a full read makes up for any pruned)."""
        ...

    def adopt(self, build: type[PeriodicTaskConfig], known: Known) -> None:
        """Build valid rows as ``build`` (the manager's entry class, adopted without a copy), and
        after the first full read reuse ``known(row_id)`` for a row whose revision it holds."""
        ...

    def judge_stored(self, raw: Sequence[Any]) -> PeriodicTaskConfig | RowError:
        """Judge a stored copy of a row (a last good version read back from a runtime store:
        ``raw`` as a row) exactly as this provider judges rows: it is data like any other."""
        ...


@runtime_checkable
class DigestingProvider(IncrementalProvider, Protocol):
    """An incremental provider that can tell, with one cheap question, that nothing was written
    since its last full read: a full reconcile due at rest then stands as that read left it."""

    async def unchanged_since_full(self) -> bool:
        """Whether the rows a full read would go through now are exactly those of the last full
        read, over the same scope, with no change read since (False when it cannot tell).
        Raises ProviderError when the source cannot be read (a failed sync)."""
        ...


@dataclass(frozen=True, slots=True)
class PartitionsHeld:
    """The partitions a manager holds now, out of ``count`` (the rows of ``pm_partitions``)."""

    count: int
    partitions: frozenset[int]

    @property
    def every(self) -> bool:
        """Every partition is held (a manager alone): reads need no partition filter."""
        return every_partition(self.partitions, self.count)


# The partitions a partitioned provider reads, asked at each read.
HeldPartitions = Callable[[], PartitionsHeld]


@runtime_checkable
class PartitionedProvider(ConfigProvider, Protocol):
    """A provider that can read only the rows of some partitions (``PM_COORDINATION=partitions``)."""

    def restrict(self, held: HeldPartitions) -> None:
        """From now on every read (full, changes) covers only the rows of the partitions
        ``held()`` names at the time of the read."""
        ...

    async def get_partitions(self, partitions: frozenset[int]) -> ProviderSnapshot:
        """Every enabled row of ``partitions`` (configs and row errors), read in full."""
        ...


# -- tasks out: targets ----------------------------------------------------------------------------


# The payload of a task built from a schedule: parsed from ``payload_json`` only when asked for.
UNPARSED: Any = object()


class Task:
    """One enqueue: a slot of a schedule, ready for a worker.

    ``expires_at``: after this instant no manager may still enqueue the slot (scheduled_at +
    grace, or the catch-up window); targets keep their claim of the key at least until then.
    ``payload_json``/``options_json``: canonical JSON when the caller has it already (a burst
    never serializes a payload per slot); ``payload`` is then parsed only if a target asks for it
    (the Redis and outbox targets send the text as it is).
    """

    __slots__ = (
        "id",
        "name",
        "task_type",
        "_payload",
        "queue",
        "options",
        "idempotency_key",
        "scheduled_at",
        "expires_at",
        "schedule_id",
        "extra",
        "payload_json",
        "options_json",
    )

    def __init__(
        self,
        id: str,  # noqa: A002 - the message field's name
        name: str,
        task_type: str,
        payload: Any,
        queue: str,
        options: Mapping[str, Any],
        idempotency_key: str,
        scheduled_at: datetime,
        expires_at: datetime,
        schedule_id: int | str | None = None,
        extra: Mapping[str, Any] | None = None,
        payload_json: str | None = None,
        options_json: str | None = None,
    ) -> None:
        self.id = id
        self.name = name
        self.task_type = task_type
        self._payload = payload
        self.queue = queue
        self.options = options
        self.idempotency_key = idempotency_key
        self.scheduled_at = scheduled_at
        self.expires_at = expires_at
        self.schedule_id = schedule_id
        self.extra = extra if extra is not None else {}
        self.payload_json = payload_json
        self.options_json = options_json

    @property
    def payload(self) -> Any:
        if self._payload is UNPARSED:
            self._payload = json.loads(self.payload_json)  # type: ignore[arg-type]
        return self._payload

    def payload_text(self) -> str:
        """The payload as canonical JSON text."""
        return self.payload_json if self.payload_json is not None else canonical_json(self.payload)

    def options_text(self) -> str:
        """The options as canonical JSON text."""
        return (
            self.options_json
            if self.options_json is not None
            else canonical_json(dict(self.options))
        )

    def __repr__(self) -> str:
        return f"Task(name={self.name!r}, idempotency_key={self.idempotency_key!r}, queue={self.queue!r})"


# States of a schedule's previous task, as a target with a completion signal sees them.
QUEUED = "queued"  # enqueued, not taken by a worker yet
RUNNING = "running"  # taken by a worker, not finished
UNFINISHED = "unfinished"  # queued or running (the target cannot tell which)
FINISHED = "finished"  # done (or gone: nothing of it is left to wait for)
NONE = "none"  # the schedule has no previous task (none known)


EnqueueStatus = Literal["enqueued", "duplicate", "resent", "failed", "busy"]


@dataclass(slots=True)
class Previous:
    """The previous task of a schedule with ``options.overlap`` skip or hold, as the target saw
    it when it decided (``task_id`` None: the schedule had none). ``timed_out``: it was not
    finished but older than ``options.overlap_timeout``, so it counted as finished."""

    task_id: str | None
    state: str
    timed_out: bool = False


@dataclass(slots=True)  # not frozen: built once per slot, and frozen __init__ is slow
class EnqueueResult:
    """What happened to one task of a batch.

    ``failed``: this task was not enqueued and holds no claim, while the rest of the batch was
    processed (a task the target cannot encode, or the group of a failed target behind a
    :class:`~periodic_manager.targets.routing.RoutingTarget`); ``error`` says why. ``permanent``
    says whether sending the task again can succeed: True for a refusal that no retry changes (the
    task itself is invalid for the target: a bad name, a bad queue name, a payload of the wrong
    shape, options it cannot honour, a key of another Redis type, an encode error), recorded
    ``failed`` at once; False (the default) for a failure that may pass (a connection lost, a
    timeout, a claim another publisher holds), retried while the slot is within its window.
    Build a refusal with :func:`refused`.

    ``resent``: enqueued again with the same task id because an earlier publish of this slot was
    never confirmed by the broker (it may have arrived: workers may see the task twice).

    ``busy``: the task's schedule asks for ``options.overlap`` skip or hold and its previous task
    is not finished, so nothing was enqueued and nothing claimed. ``previous`` (set only for such
    schedules) is what the target saw of that previous task.
    """

    task: Task
    status: EnqueueStatus
    message_id: str | None = None  # stream entry id, outbox row id, ...
    error: str | None = None
    previous: Previous | None = None
    permanent: bool = False  # failed only: no retry can succeed (see above)


def refused(task: Task, error: str) -> EnqueueResult:
    """The result of a task the target refuses for good (``failed``, ``permanent``): the task is
    not valid for it, so sending it again would fail again (see :class:`EnqueueResult`)."""
    return EnqueueResult(task, "failed", error=error, permanent=True)


def retryable(result: EnqueueResult) -> bool:
    """Whether ``result`` is a failure that a later attempt may turn into a send."""
    return result.status == "failed" and not result.permanent


@dataclass(slots=True)
class Prepared:
    """A batch made ready before its instant: the tasks, and what the target built from them."""

    tasks: list[Task]
    data: Any = None  # None: nothing was prepared (the tasks are enqueued as they are)


class Target(Protocol):
    """Enqueues batches of tasks; each idempotency key at most once, atomically with the claim of
    that key, so that two managers, a restart or a retry never enqueue a slot twice."""

    name: str

    async def enqueue(self, tasks: Sequence[Task], now: datetime) -> list[EnqueueResult]:
        """Enqueue ``tasks`` (``now`` is the enqueue instant) and report each one's fate.

        Either the whole batch is processed (results in input order) or TargetError is raised and
        no claim of the batch is left behind without its message. A processed batch may report
        single tasks as ``failed`` (not enqueued, no claim left), the others being unaffected.
        """
        ...

    async def close(self) -> None:
        """Release connections."""
        ...

    def completion_off(self, options: Mapping[str, Any]) -> str | None:
        """Why this target cannot honour ``options.overlap`` skip or hold for a schedule with
        these options: it cannot tell when the schedule's previous task finished (None: it can,
        or the options ask for ``allow``)."""
        ...


@runtime_checkable
class FailureSignal(Protocol):
    """A target that can tell a failed task from one that succeeded, which
    ``options.pause_after_failures`` needs (schedules/failures.py). A target without it refuses
    the option (``targets.completion`` says why, for the settings' checks)."""

    def failure_off(self, options: Mapping[str, Any]) -> str | None:
        """Why this target cannot tell a failed task of a schedule with these options (None: it
        can, or the options do not ask for it)."""
        ...

    async def outcomes(self, options: Mapping[str, Any], task_ids: Sequence[str]) -> list[str]:
        """The outcome of each task (``schedules.failures.OUTCOMES``: succeeded, failed,
        unknown, pending), in order; raises TargetError when the target cannot be asked."""
        ...


NO_FAILURE_SIGNAL = "it reports no outcome of its tasks"


def failure_off(target: object, options: Mapping[str, Any]) -> str | None:
    """Why ``target`` cannot honour ``options.pause_after_failures`` (None: it can, or the
    options do not ask for it): a target that is no :class:`FailureSignal` cannot tell a failed
    task. The manager's code API and the routing target ask this."""
    if "pause_after_failures" not in options:
        return None
    if not isinstance(target, FailureSignal):
        return NO_FAILURE_SIGNAL
    return target.failure_off(options)


@runtime_checkable
class Pingable(Protocol):
    """A target that can say whether its broker answers (``/readyz``); one that cannot counts as
    reachable."""

    async def ping(self) -> None:
        """Raise unless the broker the target sends to answers within its timeout."""
        ...


@runtime_checkable
class InManagerDatabase(Protocol):
    """A target that writes into the manager's own database (the outbox, procrastinate, on the
    manager's engine): its health is that database's, which every lease round proves, so the
    manager does not ping it apart (:mod:`~periodic_manager.runtime.target_health`)."""

    @property
    def in_manager_database(self) -> bool:
        """True when the target sends through the manager's own engine."""
        ...


@runtime_checkable
class Forgetful(Protocol):
    """A target whose broker can lose its data while it keeps answering (a Redis restarted
    without persistence): it can tell, through a sentinel key (:mod:`targets.redis.sentinel`)."""

    async def forgotten(self) -> list[str]:
        """The brokers (described for a log line) that lost their data since the previous call;
        raises TargetError when one cannot be asked."""
        ...


@runtime_checkable
class StagedTarget(Target, Protocol):
    """A target that can do its per-task work before the instant."""

    def prepare(self, tasks: Sequence[Task]) -> Prepared:
        """Encode ``tasks`` for sending (no I/O, no clock: called before their instant). Raises
        TargetError when the batch cannot be encoded (the scheduler then falls back to
        ``enqueue`` at the instant, which reports the failure)."""
        ...

    async def send(self, prepared: Prepared, now: datetime) -> list[EnqueueResult]:
        """Enqueue a prepared batch at ``now``: the same contract as ``enqueue``. A prepared
        batch may be sent again (a retry); the claims make that safe."""
        ...


# -- what managers publish: the runtime store ------------------------------------------------------


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
    # Why a slot was skipped or held, for the metrics: late, excluded, overlap (skip policy), overlap
    # (held), overlap-replaced, overlap-expired, overlap-released, overlap-timeout.
    reason: str | None = None
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
    trip per round instead of two (``db.store.beat_ctes`` is that heartbeat's SQL)."""

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


@dataclass(frozen=True, slots=True)
class LastGoodVersion:
    """A version to store: the entry's content, and when and at which revision the row was bad."""

    schedule_key: str
    name: str
    spec: str
    timezone: str
    anchor: datetime | None
    task_type: str
    payload_json: str
    options_json: str
    effective_at: datetime | None
    content_hash: str
    row_revision: int | None  # the revision of the good row it was read from
    bad_revision: int | None  # the revision at which the row was seen bad
    since: datetime
    manager_id: str


@dataclass(frozen=True, slots=True)
class StoredVersion:
    """A version read back, untrusted: ``raw`` holds its content columns in the raw form of a
    ``periodic_jobs`` row (``dbrows.CONTENT`` then ``effective_at``), for the row judge."""

    schedule_key: str
    raw: tuple[Any, ...]
    since: datetime | None  # None: unreadable
    bad_revision: int | None


@dataclass(frozen=True, slots=True)
class FailureCount:
    """``options.pause_after_failures``: a schedule's consecutive failed tasks as stored, and the
    sent runs after the last one counted (slot, message id), oldest first."""

    failures: int
    checked_at: datetime | None
    runs: list[tuple[datetime, str | None]]


@runtime_checkable
class FailureStore(Protocol):
    """What a runtime store offers to count failed tasks (``DatabaseRuntimeStore`` does)."""

    async def failure_count(self, schedule_key: str, limit: int) -> FailureCount:
        """The stored count of ``schedule_key`` and at most ``limit`` sent runs after it."""
        ...

    async def save_failure_count(
        self, schedule_key: str, failures: int, checked_at: datetime
    ) -> None:
        """Store the count up to the run of slot ``checked_at``, unless one at a later slot is
        stored already (two managers never move it back)."""
        ...

    async def reset_failure_count(self, schedule_key: str) -> None:
        """Count from 0 again (the manager paused the schedule for its failures)."""
        ...


class Pauser(Protocol):
    """Pauses a schedule by the manager (``options.pause_after_failures``), through the one
    schedule writer: the change history records the source ``manager``."""

    async def pause(self, schedule_key: str, note: str, manager_id: str) -> bool:
        """Pause the schedule with ``note`` unless it is gone or paused already (False)."""
        ...


@runtime_checkable
class LastGoodStore(Protocol):
    """What a runtime store offers to keep last good versions (``DatabaseRuntimeStore`` does)."""

    async def save_last_good(self, versions: Sequence[LastGoodVersion]) -> None:
        """Insert or replace each version, unless the stored one was seen bad at a later
        revision; an unchanged content keeps its ``since``."""
        ...

    async def last_good_index(self) -> dict[str, int | None]:
        """The keys that have a stored version, each with its ``bad_revision``."""
        ...

    async def load_last_good(self, keys: Sequence[str]) -> list[StoredVersion]:
        """The stored versions of ``keys`` (absent keys are missing)."""
        ...

    async def forget_last_good(self, keys: Sequence[str], revision: int | None) -> None:
        """Delete the versions of ``keys`` seen bad at or before ``revision`` (None: any)."""
        ...


# -- coordination: leadership and change signals ---------------------------------------------------


ChangeCallback = Callable[[bool], Awaitable[None] | None]
# A change signal's callback: the partitions whose rows changed, or None when anything may have.
SignalCallback = Callable[[frozenset[int] | None], None]


class Leadership(Protocol):
    """Decides whether this manager may enqueue."""

    @property
    def is_leader(self) -> bool: ...

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The background loop, if any (the manager supervises it: its death is the manager's)."""
        ...

    async def start(self, on_change: ChangeCallback) -> None:
        """Begin campaigning, calling ``on_change(is_leader)`` on every change (returns at once;
        the first attempt has been made)."""
        ...

    async def stop(self) -> None:
        """Stop campaigning and release leadership (``on_change(False)`` first)."""
        ...


class PartitionHandler(Protocol):
    """What a manager does when its partitions change (``PM_COORDINATION=partitions``)."""

    async def gained(
        self,
        partitions: frozenset[int],
        fresh: frozenset[int],
        first_held: Mapping[int, datetime],
    ) -> None:
        """Leases on ``partitions`` were taken: read their rows, start after what is settled.
        ``fresh``: those of them no manager ever held (their schedules start as at a first
        start, with no look back). ``first_held``: for the others, the instant a manager first
        took each one (that manager's clock): slots due until then are owed by nobody, so their
        takeover looks back no further than it; one held before that instant was recorded
        (before migration 0022) is missing, and looks back the full grace."""
        ...

    async def releasing(self, partitions: frozenset[int]) -> None:
        """``partitions`` are handed over: stop sending for them, wait for a send under way and
        flush what was sent to the store; the leases are released once this returns."""
        ...

    def lost(self, partitions: frozenset[int]) -> None:
        """``partitions`` are no longer held (taken by another, or trust ran out): stop sending
        for them at once (never blocks)."""
        ...


@runtime_checkable
class PartitionLeadership(Leadership, Protocol):
    """Leadership by partitions: this manager leads the partitions it holds (``is_leader``
    while it holds one); :meth:`trusted` is whether it may still send for one now."""

    @property
    def count(self) -> int:
        """The number of partitions (known once started)."""
        ...

    @property
    def held(self) -> frozenset[int]:
        """The partitions whose lease is held and trusted."""
        ...

    def trusted(self, partition: int) -> bool:
        """Whether ``partition``'s lease is held and still trusted at this instant."""
        ...

    @property
    def handovers(self) -> int:
        """Partitions handed over cleanly so far."""
        ...

    def expire(self) -> None:
        """Drop at once every partition whose trust has ended (the handler's ``lost``); called
        right before every send."""
        ...

    def attach(self, handler: PartitionHandler) -> None:
        """Tell ``handler`` about every change of the partitions held (before :meth:`start`)."""
        ...


class ChangeSignal(Protocol):
    """Tells the manager that schedules changed (PostgreSQL LISTEN, say), so it syncs at once."""

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The background loop, if any (supervised as the manager's own)."""
        ...

    async def start(self, on_change: SignalCallback) -> None:
        """Begin listening, calling ``on_change(partitions)`` (never blocking) whenever
        schedules may have changed: ``partitions`` names the partitions of the rows changed when
        the signal knows them (``PM_COORDINATION=partitions``: a manager holding none of them
        does not sync), None when anything may have changed (and after any gap in listening)."""
        ...

    async def stop(self) -> None: ...


# -- the API's view of an in-process manager -------------------------------------------------------


class ManagerHandle(Protocol):
    """What the API does with the manager it runs in its own process."""

    @property
    def target(self) -> Target:
        """Where manual triggers go."""
        ...

    @property
    def is_leader(self) -> bool: ...

    @property
    def registry(self) -> Any:
        """The Prometheus registry ``/metrics`` serves."""
        ...

    async def start(self) -> None:
        """Start scheduling; awaited before the API serves requests."""
        ...

    async def stop(self) -> None:
        """Stop scheduling; awaited when the API shuts down."""
        ...

    def request_sync(self) -> None:
        """Ask for a sync soon, without waiting for it (called after every successful write)."""
        ...

    def health(self) -> str | None:
        """None while every loop runs; otherwise why the manager is not healthy (one line)."""
        ...

    @property
    def standing_down(self) -> str | None:
        """Why the manager holds no work while its targets do not answer (None: it may)."""
        ...

    def clock_check(self) -> str:
        """Its wall clock against the database's (``/readyz``'s ``clock``): ``ok``, ``skewed:
        ...`` (ready, said) or ``failed: ...`` (not ready: it holds and sends nothing)."""
        ...


def run_status(status: EnqueueStatus) -> RunStatus:
    """The run a target's answer becomes (``busy`` has none of its own: the overlap guard records
    the slot skipped or held)."""
    if status == "busy":
        raise ValueError("a busy answer is recorded as skipped or held")
    return status
