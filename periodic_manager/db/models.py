"""SQLAlchemy models. The schema itself is owned by ``migrations/`` (Alembic); product code never
calls ``create_all``. Works on PostgreSQL (asyncpg), SQLite (aiosqlite) and MariaDB/MySQL
(asyncmy; the types that differ there are listed in ``migrations/dialect.py``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    false,
    func,
    true,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

# BIGINT on PostgreSQL; INTEGER on SQLite, where only "INTEGER PRIMARY KEY" is the rowid alias.
BigId = BigInteger().with_variant(Integer(), "sqlite")
# Ids are never handed out twice: PostgreSQL's BIGSERIAL sequences never do; SQLite needs
# AUTOINCREMENT, or it reuses the id of the newest row once that row is deleted (migration 0007).
NEVER_REUSED = {"sqlite_autoincrement": True}


class _LongTextImpl(TypeDecorator[Any]):
    """TEXT, LONGTEXT on MariaDB/MySQL. The MySQL dialect is imported by a process that talks to
    MySQL, not by every process that imports the models (a manager on PostgreSQL)."""

    impl = Text
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name in ("mysql", "mariadb"):
            from sqlalchemy.dialects.mysql import LONGTEXT

            return dialect.type_descriptor(LONGTEXT())
        return super().load_dialect_impl(dialect)


class JsonText(_LongTextImpl):
    """MariaDB/MySQL: a JSON value kept as LONGTEXT with no JSON check, so that a row holding
    invalid JSON text can be stored (by plain SQL) and then reported by the row judge."""

    def process_bind_param(self, value: Any, dialect: Dialect) -> str:
        return json.dumps(value)

    def process_result_value(self, value: str | None, dialect: Dialect) -> Any:
        return None if value is None else json.loads(value)


JsonValue = (
    JSON(none_as_null=False)
    .with_variant(JSONB(none_as_null=False), "postgresql")
    .with_variant(JsonText(), "mysql", "mariadb")
)


# Text that may be longer than MySQL's TEXT (64 KiB): JSON of a payload, of a change.
LongText = _LongTextImpl()


class UTCDateTime(TypeDecorator[datetime]):
    """An instant: aware datetimes in, aware UTC datetimes out, on every backend.

    SQLite and MariaDB/MySQL have no zone-aware type; values are stored as UTC and read back
    tagged as UTC.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        # MariaDB/MySQL: DATETIME(6), holding UTC (a plain DATETIME drops the microseconds).
        if dialect.name in ("mysql", "mariadb"):
            from sqlalchemy.dialects.mysql import DATETIME

            return dialect.type_descriptor(DATETIME(fsp=6))
        return dialect.type_descriptor(DateTime(timezone=True))

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError("naive datetime given for a timestamp column; pass an aware instant")
        value = value.astimezone(UTC)
        return value if dialect.name == "postgresql" else value.replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


Instant = UTCDateTime()

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class PeriodicJob(Base):
    """A schedule row. Anyone with database access may write it; the manager validates it."""

    __tablename__ = "periodic_jobs"
    __table_args__ = NEVER_REUSED

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), unique=True, nullable=False)
    spec: Mapped[str] = mapped_column(String(200), nullable=False)
    timezone: Mapped[str] = mapped_column(String(64), nullable=False, server_default="UTC")
    anchor: Mapped[datetime | None] = mapped_column(Instant, nullable=True)
    task_type: Mapped[str] = mapped_column(String(200), nullable=False)
    payload: Mapped[Any] = mapped_column(JsonValue, nullable=True)
    options: Mapped[Any] = mapped_column(JsonValue, nullable=False, server_default="{}")
    enabled: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=true())
    description: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(Instant, nullable=False, server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(
        Instant, nullable=False, server_default=func.now(), onupdate=func.now()
    )
    # No slot at or before this instant is ever sent (a takeover's look back over grace, a
    # fire_once catch-up). Set at insert and by every change of name, spec, timezone or anchor and
    # every resume: by the API with its clock, else by a trigger (migration 0004). Untrusted like
    # every column: a NULL or unreadable value means "unknown", and then nothing is looked back at.
    effective_at: Mapped[datetime | None] = mapped_column(Instant, nullable=True)
    # Set by a trigger on every INSERT/UPDATE from one counter shared with the tombstones below, in
    # commit order (writers of this table are serialized), so "rows with revision > watermark" is
    # exactly what changed since a sync. Never written by hand.
    revision: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0", index=True)
    # Who paused the schedule, when and why (migration 0009): set by the schedule writer on a pause
    # (``paused_by``: "api", "import"), by a trigger for plain SQL ("sql"), cleared on resume. Read
    # by people only: no part of the schedule's content.
    paused_note: Mapped[str | None] = mapped_column(Text, nullable=True)
    paused_at: Mapped[datetime | None] = mapped_column(Instant, nullable=True)
    paused_by: Mapped[str | None] = mapped_column(String(64), nullable=True)


class Calendar(Base):
    """An exclusion calendar (``options.exclude``): a name and its content, the canonical JSON
    ``{"dates": [...]}`` or ``{"holidays": {"country": ..., "subdiv": ...}}``. Written by
    ``db/calendars.py`` (the API, ``import``) or by plain SQL; untrusted like every column: read
    as text and judged by ``schedules/calendars.py``. Triggers (migration 0016) give every row of
    ``periodic_jobs`` that names a written or deleted calendar a new revision, so managers re-read
    exactly those schedules."""

    __tablename__ = "pm_calendars"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    spec: Mapped[str] = mapped_column(LongText, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(Instant, nullable=False, server_default=func.now())


class DeletedJob(Base):
    """Tombstone of a deleted ``periodic_jobs`` row (a trigger writes it), so a sync that reads only
    what changed also sees deletions. ``id`` 0 marks a TRUNCATE: everything must be re-read."""

    __tablename__ = "periodic_jobs_deleted"

    revision: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    id: Mapped[int] = mapped_column(BigInteger, nullable=False)
    deleted_at: Mapped[datetime] = mapped_column(Instant, nullable=False, server_default=func.now())


# Tables that migrations create but the models do not describe (ignored by autogenerate):
# the revision counter of SQLite and MariaDB/MySQL (PostgreSQL uses the sequence
# periodic_jobs_revision_seq instead).
UNMANAGED_TABLES = frozenset({"pm_revision"})


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Alembic autogenerate filter: skip :data:`UNMANAGED_TABLES`."""
    return not (type_ == "table" and name in UNMANAGED_TABLES)


class Manager(Base):
    """A running manager process; a heartbeat updates one row (O(1) writes)."""

    __tablename__ = "pm_managers"

    manager_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(255), nullable=False)
    pid: Mapped[int] = mapped_column(Integer, nullable=False)
    version: Mapped[str] = mapped_column(String(32), nullable=False)
    started_at: Mapped[datetime] = mapped_column(Instant, nullable=False)
    heartbeat_at: Mapped[datetime] = mapped_column(Instant, nullable=False)
    is_leader: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=false())
    last_sync_at: Mapped[datetime | None] = mapped_column(Instant, nullable=True)
    last_sync_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    entry_count: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")


class Partition(Base):
    """A partition of the schedules and its lease (``PM_COORDINATION=partitions``): who holds
    it, the fencing epoch its holder took it at (bumped by every take), and until when the lease
    runs (database time). One row per partition, made at ``migrate``: the row count is the
    partition count."""

    __tablename__ = "pm_partitions"

    partition: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    holder: Mapped[str | None] = mapped_column(String(64), nullable=True)
    epoch: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    expires_at: Mapped[datetime | None] = mapped_column(Instant, nullable=True)
    renewed_at: Mapped[datetime | None] = mapped_column(Instant, nullable=True)


class PartitionMember(Base):
    """A manager taking part in the partition leases, alive until ``expires_at`` (database
    time, renewed with its leases): the live members decide the fair share."""

    __tablename__ = "pm_partition_members"

    member: Mapped[str] = mapped_column(String(64), primary_key=True)
    expires_at: Mapped[datetime] = mapped_column(Instant, nullable=False)


class Entry(Base):
    """What a manager registered: one row per entry, written only when the entry changes.

    ``status`` is ``active`` for a registered entry and ``error`` for a row the manager rejected
    (then ``last_error`` says why and ``content_hash`` is the hash of the raw row).
    """

    __tablename__ = "pm_entries"

    manager_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("pm_managers.manager_id", ondelete="CASCADE"), primary_key=True
    )
    entry_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    schedule_key: Mapped[str] = mapped_column(String(128), nullable=False, index=True)
    name: Mapped[str | None] = mapped_column(String(200), nullable=True)
    content_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    spec: Mapped[str | None] = mapped_column(String(200), nullable=True)
    timezone: Mapped[str | None] = mapped_column(String(64), nullable=True)
    anchor: Mapped[datetime | None] = mapped_column(Instant, nullable=True)
    task_type: Mapped[str | None] = mapped_column(String(200), nullable=True)
    queue: Mapped[str | None] = mapped_column(String(100), nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    registered_at: Mapped[datetime] = mapped_column(Instant, nullable=False)
    # options.overlap skip/hold: the slot held while the previous task runs, and that task as the
    # manager last saw it (queued, running, unfinished, finished).
    held_slot_at: Mapped[datetime | None] = mapped_column(Instant, nullable=True)
    previous_task_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    previous_task_state: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # An error record whose row has a last good version this manager keeps running: since when
    # it is kept (null: no version of the row runs here).
    last_good_since: Mapped[datetime | None] = mapped_column(Instant, nullable=True)


class ScheduleState(Base):
    """Runtime state per schedule, written in batches in the same step as the enqueue."""

    __tablename__ = "pm_schedule_state"

    schedule_key: Mapped[str] = mapped_column(String(128), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    last_slot_at: Mapped[datetime | None] = mapped_column(Instant, nullable=True)
    # The latest slot settled for good (enqueued, found enqueued, re-published or skipped): a
    # takeover or a catch-up never sends a slot at or before it, whatever the broker remembers.
    last_done_at: Mapped[datetime | None] = mapped_column(Instant, nullable=True)
    last_enqueued_at: Mapped[datetime | None] = mapped_column(Instant, nullable=True)
    last_message_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    last_status: Mapped[str | None] = mapped_column(String(16), nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    enqueued_count: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    duplicate_count: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    skipped_count: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    failed_count: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    held_count: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    resent_count: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    # options.max_runs: distinct slots recorded sent while the schedule had it (schedules/runs.py).
    runs_count: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    # options.pause_after_failures: failed tasks in a row, counted up to the run of slot
    # failures_checked_at (schedules/failures.py).
    consecutive_failures: Mapped[int] = mapped_column(
        BigInteger, nullable=False, server_default="0"
    )
    failures_checked_at: Mapped[datetime | None] = mapped_column(Instant, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(Instant, nullable=False)


class LastGood(Base):
    """The last good version of a row that turned bad, kept so that a manager that starts or
    takes over while the row is still bad runs it too (docs/guarantees.md: "until it is fixed or
    deleted"). Written by the manager that held the good version when the row turned bad, deleted
    once the row is good again, disabled or deleted. Read back as untrusted as a row: judged by
    the same judge (``db/judge.py``) before it is run.

    The content columns are those of ``periodic_jobs`` (payload and options as canonical JSON
    text). ``bad_revision`` is the revision at which the row was seen bad: a manager that sees the
    row not bad at a later revision forgets the version, one with an older view leaves it.
    """

    __tablename__ = "pm_last_good"

    schedule_key: Mapped[str] = mapped_column(String(128), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    spec: Mapped[str] = mapped_column(String(200), nullable=False)
    timezone: Mapped[str] = mapped_column(String(64), nullable=False)
    anchor: Mapped[datetime | None] = mapped_column(Instant, nullable=True)
    task_type: Mapped[str] = mapped_column(String(200), nullable=False)
    payload: Mapped[str] = mapped_column(LongText, nullable=False)  # canonical JSON text
    options: Mapped[str] = mapped_column(LongText, nullable=False)  # canonical JSON text
    effective_at: Mapped[datetime | None] = mapped_column(Instant, nullable=True)
    content_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    row_revision: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    bad_revision: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    since: Mapped[datetime] = mapped_column(Instant, nullable=False)  # kept since (the row turned bad)
    manager_id: Mapped[str | None] = mapped_column(String(64), nullable=True)  # who kept it first


class OutboxMessage(Base):
    """A task enqueued to the database outbox; unique on the idempotency key.

    Consumers claim rows with ``FOR UPDATE SKIP LOCKED`` (PostgreSQL) and set ``processed_at``.
    """

    __tablename__ = "pm_outbox"
    __table_args__ = (
        Index("ix_pm_outbox_pending", "queue", "processed_at", "seq"),
        Index("ix_pm_outbox_name_seq", "name", "seq"),  # a schedule's newest row (overlap)
        NEVER_REUSED,  # seq is the message id, and the cursor a consumer may keep
    )

    seq: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(36), nullable=False)
    idempotency_key: Mapped[str] = mapped_column(String(300), nullable=False, unique=True)
    queue: Mapped[str] = mapped_column(String(100), nullable=False)
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    task_type: Mapped[str] = mapped_column(String(200), nullable=False)
    payload: Mapped[str] = mapped_column(LongText, nullable=False)  # JSON text, as in the Redis stream
    options: Mapped[str] = mapped_column(LongText, nullable=False)  # JSON text
    scheduled_at: Mapped[datetime] = mapped_column(Instant, nullable=False)
    enqueued_at: Mapped[datetime] = mapped_column(Instant, nullable=False)
    processed_at: Mapped[datetime | None] = mapped_column(Instant, nullable=True)


class ProcrastinateSent(Base):
    """A task the procrastinate target inserted into ``procrastinate_jobs``: its idempotency key,
    unique, written in the same transaction as the job (exactly once without Redis). Rows whose
    ``expires_at`` has passed are pruned by the target as it sends (a schedule's newest kept: it is
what ``options.overlap`` looks at)."""

    __tablename__ = "pm_procrastinate_sent"
    __table_args__ = (
        Index("ix_pm_procrastinate_sent_expires_at", "expires_at"),
        Index("ix_pm_procrastinate_sent_name_job_id", "name", "job_id"),  # newest job (overlap)
    )

    idempotency_key: Mapped[str] = mapped_column(String(300), primary_key=True)
    job_id: Mapped[int] = mapped_column(BigInteger, nullable=False)  # procrastinate_jobs.id
    name: Mapped[str] = mapped_column(String(200), nullable=False)  # the schedule's
    task_id: Mapped[str] = mapped_column(String(36), nullable=False)
    enqueued_at: Mapped[datetime] = mapped_column(Instant, nullable=False)
    expires_at: Mapped[datetime] = mapped_column(Instant, nullable=False)


class ScheduleChange(Base):
    """The change history of ``periodic_jobs``: one row per change of a schedule's tracked
    columns (:data:`periodic_manager.db.change_history.TRACKED`): created, updated, paused,
    resumed, deleted. Written by triggers on ``periodic_jobs`` (migration 0012) on both databases,
    so plain SQL is seen too; the schedule writer marks its own statements' ``source`` (``api``,
    ``import``, ``manager``; anything else is ``sql``) and ``actor``. ``changes`` is JSON text,
    ``{column: {"before": text|null, "after": text|null}}`` with each value the column's stored
    text cut to 2000 characters (``"truncated": true`` then). Kept after the row is deleted;
    bounded by age and by a count per schedule, pruned by the manager's store."""

    __tablename__ = "pm_schedule_changes"
    __table_args__ = (
        Index("ix_pm_schedule_changes_schedule_id_id", "schedule_id", "id"),
        Index("ix_pm_schedule_changes_at", "at"),
        NEVER_REUSED,
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    schedule_id: Mapped[int] = mapped_column(BigInteger, nullable=False)
    name: Mapped[str | None] = mapped_column(String(200), nullable=True)
    at: Mapped[datetime] = mapped_column(Instant, nullable=False)
    action: Mapped[str] = mapped_column(String(16), nullable=False)
    source: Mapped[str] = mapped_column(String(16), nullable=False)
    actor: Mapped[str | None] = mapped_column(String(200), nullable=True)
    changes: Mapped[str] = mapped_column(LongText, nullable=False)  # JSON text


class Run(Base):
    """History: one row per slot outcome (enqueued, duplicate, skipped, failed) or manual trigger.

    Written in the same transaction as ``pm_schedule_state`` by the manager's store; bounded by
    age and by a count per schedule (see ``DatabaseRuntimeStore.prune_runs``) and deleted with its
    schedule. ``lateness_ms`` is ``at - slot_at``.
    """

    __tablename__ = "pm_runs"
    __table_args__ = (
        Index("ix_pm_runs_schedule_key_slot_at", "schedule_key", "slot_at"),
        Index("ix_pm_runs_at", "at"),
        NEVER_REUSED,
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    schedule_key: Mapped[str] = mapped_column(String(128), nullable=False)
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    slot_at: Mapped[datetime] = mapped_column(Instant, nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    at: Mapped[datetime] = mapped_column(Instant, nullable=False)
    lateness_ms: Mapped[int] = mapped_column(BigInteger, nullable=False)
    message_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
