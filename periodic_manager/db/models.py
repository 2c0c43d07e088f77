"""The tables, as SQLAlchemy Core ``Table``s (no ORM mapping: every statement is Core, and a
process loads no declarative machinery). The schema itself is owned by ``migrations/`` (Alembic);
product code never calls ``create_all``. Works on PostgreSQL (asyncpg), SQLite (aiosqlite) and MariaDB/MySQL
(asyncmy; the types that differ there are listed in ``migrations/dialect.py``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
    func,
    true,
)

from periodic_manager.db.column_types import BigId, JsonValue, LongText
from periodic_manager.db.column_types import at_column as _at
from periodic_manager.db.column_types import name_column as _name
from periodic_manager.db.column_types import schedule_key_column as _schedule_key
from periodic_manager.db.column_types import serial_id as _serial_id

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


metadata = MetaData(naming_convention=NAMING)


# A schedule row. Anyone with database access may write it; the manager validates it.
jobs_table = Table(
    "periodic_jobs",
    metadata,
    _serial_id(),
    _name(unique=True, nullable=False),
    Column("spec", String(200), nullable=False),
    Column("timezone", String(64), nullable=False, server_default="UTC"),
    _at("anchor", nullable=True),
    Column("task_type", String(200), nullable=False),
    Column("payload", JsonValue, nullable=True),
    Column("options", JsonValue, nullable=False, server_default="{}"),
    Column("enabled", Boolean, nullable=False, server_default=true()),
    Column("description", Text, nullable=True),
    _at("created_at", nullable=False, server_default=func.now()),
    _at("updated_at", nullable=False, server_default=func.now(), onupdate=func.now()),
    # No slot at or before this instant is ever sent (a takeover's look back over grace, a
    # fire_once catch-up). Set at insert and by every change of name, spec, timezone or anchor and
    # every resume: by the API with its clock, else by a trigger (migration 0004). Untrusted like
    # every column: a NULL or unreadable value means "unknown", and then nothing is looked back at.
    _at("effective_at", nullable=True),
    # Set by a trigger on every INSERT/UPDATE from one counter shared with the tombstones below, in
    # commit order (writers of this table are serialized), so "rows with revision > watermark" is
    # exactly what changed since a sync. Never written by hand.
    Column("revision", BigInteger, nullable=False, server_default="0", index=True),
    # Who paused the schedule, when and why (migration 0009): set by the schedule writer on a pause
    # (``paused_by``: "api", "import"), by a trigger for plain SQL ("sql"), cleared on resume. Read
    # by people only: no part of the schedule's content.
    Column("paused_note", Text, nullable=True),
    _at("paused_at", nullable=True),
    Column("paused_by", String(64), nullable=True),
    sqlite_autoincrement=True,
)


# An exclusion calendar (``options.exclude``): a name and its content, the canonical JSON
# ``{"dates": [...]}`` or ``{"holidays": {"country": ..., "subdiv": ...}}``. Written by
# ``db/calendars.py`` (the API, ``import``) or by plain SQL; untrusted like every column: read
# as text and judged by ``schedules/calendars.py``. Triggers (migration 0016) give every row of
# ``periodic_jobs`` that names a written or deleted calendar a new revision, so managers re-read
# exactly those schedules.
calendars_table = Table(
    "pm_calendars",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("spec", LongText, nullable=False),
    _at("updated_at", nullable=False, server_default=func.now()),
)


# Tombstone of a deleted ``periodic_jobs`` row (a trigger writes it), so a sync that reads only
# what changed also sees deletions. ``id`` 0 marks a TRUNCATE: everything must be re-read.
deleted_jobs_table = Table(
    "periodic_jobs_deleted",
    metadata,
    Column("revision", BigInteger, primary_key=True, autoincrement=False),
    Column("id", BigInteger, nullable=False),
    _at("deleted_at", nullable=False, server_default=func.now()),
)


# Tables that migrations create but the models do not describe (ignored by autogenerate):
# the revision counter of SQLite and MariaDB/MySQL (PostgreSQL uses the sequence
# periodic_jobs_revision_seq instead).
UNMANAGED_TABLES = frozenset({"pm_revision"})


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """Alembic autogenerate filter: skip :data:`UNMANAGED_TABLES`."""
    return not (type_ == "table" and name in UNMANAGED_TABLES)


# A running manager process; a heartbeat updates one row (O(1) writes).
managers_table = Table(
    "pm_managers",
    metadata,
    Column("manager_id", String(64), primary_key=True),
    Column("hostname", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("version", String(32), nullable=False),
    _at("started_at", nullable=False),
    _at("heartbeat_at", nullable=False),
    Column("is_leader", Boolean, nullable=False, server_default=false()),
    _at("last_sync_at", nullable=True),
    Column("last_sync_error", Text, nullable=True),
    Column("entry_count", Integer, nullable=False, server_default="0"),
    # Why the manager holds no work (its targets do not answer their pings); null: it may.
    Column("target_down", Text, nullable=True),
    # Seconds its wall clock is ahead of the database's, as last measured (null: not measured).
    Column("clock_offset_s", Double, nullable=True),
)


# A partition of the schedules and its lease (``PM_COORDINATION=partitions``): who holds
# it, the fencing epoch its holder took it at (bumped by every take), until when the lease
# runs (database time), and when a manager first took it (that manager's clock: a takeover
# looks back no further; null for a partition never held, or held before migration 0022).
# One row per partition, made at ``migrate``: the row count is the partition count.
partitions_table = Table(
    "pm_partitions",
    metadata,
    Column("partition", Integer, primary_key=True, autoincrement=False),
    Column("holder", String(64), nullable=True),
    Column("epoch", BigInteger, nullable=False, server_default="0"),
    _at("expires_at", nullable=True),
    _at("renewed_at", nullable=True),
    _at("first_held_at", nullable=True),
)


# A manager taking part in the partition leases, alive until ``expires_at`` (database
# time, renewed with its leases): the live members decide the fair share.
partition_members_table = Table(
    "pm_partition_members",
    metadata,
    Column("member", String(64), primary_key=True),
    _at("expires_at", nullable=False),
    # The member said, at its last round, that its session holds its liveness lock
    # (runtime.liveness_lock): its leases are free at once when that lock is.
    Column("liveness_lock", Boolean, nullable=False, server_default=false()),
)


# What a manager registered: one row per entry, written only when the entry changes.
#
# ``status`` is ``active`` for a registered entry and ``error`` for a row the manager rejected
# (then ``last_error`` says why and ``content_hash`` is the hash of the raw row).
entries_table = Table(
    "pm_entries",
    metadata,
    Column(
        "manager_id",
        String(64),
        ForeignKey("pm_managers.manager_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("entry_id", String(128), primary_key=True),
    _schedule_key(nullable=False, index=True),
    _name(nullable=True),
    Column("content_hash", String(64), nullable=False),
    Column("status", String(16), nullable=False),
    Column("spec", String(200), nullable=True),
    Column("timezone", String(64), nullable=True),
    _at("anchor", nullable=True),
    Column("task_type", String(200), nullable=True),
    Column("queue", String(100), nullable=True),
    Column("last_error", Text, nullable=True),
    _at("registered_at", nullable=False),
    # options.overlap skip/hold: the slot held while the previous task runs, and that task as the
    # manager last saw it (queued, running, unfinished, finished).
    _at("held_slot_at", nullable=True),
    Column("previous_task_id", String(128), nullable=True),
    Column("previous_task_state", String(32), nullable=True),
    # An error record whose row has a last good version this manager keeps running: since when
    # it is kept (null: no version of the row runs here).
    _at("last_good_since", nullable=True),
)


# The counters of ``pm_schedule_state``, one column per run status.
COUNT_COLUMNS = {
    "enqueued": "enqueued_count",
    "duplicate": "duplicate_count",
    "skipped": "skipped_count",
    "failed": "failed_count",
    "held": "held_count",
    "resent": "resent_count",
}


def _counter(name: str) -> Column[Any]:
    """A count kept by the database, from 0."""
    return Column(name, BigInteger, nullable=False, server_default="0")


# Runtime state per schedule, written in batches in the same step as the enqueue.
schedule_state_table = Table(
    "pm_schedule_state",
    metadata,
    _schedule_key(primary_key=True),
    _name(nullable=False),
    _at("last_slot_at", nullable=True),
    # The latest slot settled for good (enqueued, found enqueued, re-published or skipped): a
    # takeover or a catch-up never sends a slot at or before it, whatever the broker remembers.
    _at("last_done_at", nullable=True),
    _at("last_enqueued_at", nullable=True),
    Column("last_message_id", String(128), nullable=True),
    Column("last_status", String(16), nullable=True),
    Column("last_error", Text, nullable=True),
    *(_counter(column) for column in COUNT_COLUMNS.values()),
    # options.max_runs: distinct slots recorded sent while the schedule had it (schedules/runs.py).
    _counter("runs_count"),
    # options.pause_after_failures: failed tasks in a row, counted up to the run of slot
    # failures_checked_at (schedules/failures.py).
    _counter("consecutive_failures"),
    _at("failures_checked_at", nullable=True),
    _at("updated_at", nullable=False),
)


# The last good version of a row that turned bad, kept so that a manager that starts or
# takes over while the row is still bad runs it too (docs/guarantees.md: "until it is fixed or
# deleted"). Written by the manager that held the good version when the row turned bad, deleted
# once the row is good again, disabled or deleted. Read back as untrusted as a row: judged by
# the same judge (``db/judge.py``) before it is run.
#
# The content columns are those of ``periodic_jobs`` (payload and options as canonical JSON
# text). ``bad_revision`` is the revision at which the row was seen bad: a manager that sees the
# row not bad at a later revision forgets the version, one with an older view leaves it.
last_good_table = Table(
    "pm_last_good",
    metadata,
    _schedule_key(primary_key=True),
    _name(nullable=False),
    Column("spec", String(200), nullable=False),
    Column("timezone", String(64), nullable=False),
    _at("anchor", nullable=True),
    Column("task_type", String(200), nullable=False),
    Column("payload", LongText, nullable=False),  # canonical JSON text
    Column("options", LongText, nullable=False),  # canonical JSON text
    _at("effective_at", nullable=True),
    Column("content_hash", String(64), nullable=False),
    Column("row_revision", BigInteger, nullable=True),
    Column("bad_revision", BigInteger, nullable=True),
    _at("since", nullable=False),  # kept since (the row turned bad)
    Column("manager_id", String(64), nullable=True),  # who kept it first
)


# A task enqueued to the database outbox; unique on the idempotency key.
#
# Consumers claim rows with ``FOR UPDATE SKIP LOCKED`` (PostgreSQL) and set ``processed_at``.
outbox_table = Table(
    "pm_outbox",
    metadata,
    Column("seq", BigId, primary_key=True, autoincrement=True),
    Column("task_id", String(36), nullable=False),
    Column("idempotency_key", String(300), nullable=False, unique=True),
    Column("queue", String(100), nullable=False),
    _name(nullable=False),
    Column("task_type", String(200), nullable=False),
    Column("payload", LongText, nullable=False),  # JSON text, as in the Redis stream
    Column("options", LongText, nullable=False),  # JSON text
    _at("scheduled_at", nullable=False),
    _at("enqueued_at", nullable=False),
    _at("processed_at", nullable=True),
    Index("ix_pm_outbox_pending", "queue", "processed_at", "seq"),
    Index("ix_pm_outbox_name_seq", "name", "seq"),  # a schedule's newest row (overlap)
    sqlite_autoincrement=True,  # seq is the message id, and the cursor a consumer may keep
)


# A task the procrastinate target inserted into ``procrastinate_jobs``: its idempotency key,
# unique, written in the same transaction as the job (exactly once without Redis). Rows whose
# ``expires_at`` has passed are pruned by the target as it sends (a schedule's newest kept: it is
# what ``options.overlap`` looks at).
procrastinate_sent_table = Table(
    "pm_procrastinate_sent",
    metadata,
    Column("idempotency_key", String(300), primary_key=True),
    Column("job_id", BigInteger, nullable=False),  # procrastinate_jobs.id
    _name(nullable=False),  # the schedule's
    Column("task_id", String(36), nullable=False),
    _at("enqueued_at", nullable=False),
    _at("expires_at", nullable=False),
    Index("ix_pm_procrastinate_sent_expires_at", "expires_at"),
    Index("ix_pm_procrastinate_sent_name_job_id", "name", "job_id"),  # newest job (overlap)
)


# The change history of ``periodic_jobs``: one row per change of a schedule's tracked
# columns (:data:`periodic_manager.db.change_history.TRACKED`): created, updated, paused,
# resumed, deleted. Written by triggers on ``periodic_jobs`` (migration 0012) on both databases,
# so plain SQL is seen too; the schedule writer marks its own statements' ``source`` (``api``,
# ``import``, ``manager``; anything else is ``sql``) and ``actor``. ``changes`` is JSON text,
# ``{column: {"before": text|null, "after": text|null}}`` with each value the column's stored
# text cut to 2000 characters (``"truncated": true`` then). Kept after the row is deleted;
# bounded by age and by a count per schedule, pruned by the manager's store.
schedule_changes_table = Table(
    "pm_schedule_changes",
    metadata,
    _serial_id(),
    Column("schedule_id", BigInteger, nullable=False),
    _name(nullable=True),
    _at("at", nullable=False),
    Column("action", String(16), nullable=False),
    Column("source", String(16), nullable=False),
    Column("actor", String(200), nullable=True),
    Column("changes", LongText, nullable=False),  # JSON text
    Index("ix_pm_schedule_changes_schedule_id_id", "schedule_id", "id"),
    Index("ix_pm_schedule_changes_at", "at"),
    sqlite_autoincrement=True,
)


# What backfills sent, one row per slot (periodic_manager/backfill.py): claimed before a slot
# goes out (``state`` 'sending', ``owner`` the backfill run), 'sent' once the target took it,
# deleted again when it did not. Unique on (schedule_key, slot_at): of two racing backfills only
# one claims a slot. Remembered for PM_RUNS_RETENTION from ``at`` whatever the history's cap per
# schedule; pruned with the run history; deleted with its schedule.
backfill_slots_table = Table(
    "pm_backfill_slots",
    metadata,
    _serial_id(),
    _schedule_key(nullable=False),
    _at("slot_at", nullable=False),
    Column("state", String(16), nullable=False),
    Column("owner", String(64), nullable=False),
    _at("at", nullable=False),
    UniqueConstraint("schedule_key", "slot_at"),
    Index("ix_pm_backfill_slots_at", "at"),
)


# History: one row per slot outcome (enqueued, duplicate, skipped, failed) or manual trigger.
#
# Written in the same transaction as ``pm_schedule_state`` by the manager's store; bounded by
# age and by a count per schedule (see ``DatabaseRuntimeStore.prune_runs``) and deleted with its
# schedule. ``lateness_ms`` is ``at - slot_at``.
runs_table = Table(
    "pm_runs",
    metadata,
    _serial_id(),
    _schedule_key(nullable=False),
    _name(nullable=False),
    _at("slot_at", nullable=False),
    Column("status", String(16), nullable=False),
    _at("at", nullable=False),
    Column("lateness_ms", BigInteger, nullable=False),
    Column("message_id", String(128), nullable=True),
    Column("error", Text, nullable=True),
    # Why it was skipped, held or failed (contracts.SlotReason), null when it has no reason.
    Column("reason", String(32), nullable=True),
    Index("ix_pm_runs_schedule_key_slot_at", "schedule_key", "slot_at"),
    Index("ix_pm_runs_at", "at"),
    sqlite_autoincrement=True,
)


# A slot the http target is delivering (or delivered, or gave up on: ``state`` pending, done,
# dead). Unique on the idempotency key: a second send of a slot (another manager, a restart)
# finds the row, so each slot is one delivery. The deliverer of any manager claims due rows with
# a lease (``locked_by``, ``locked_until``); dead rows are the dead letters. Written only by
# ``db/http_deliveries.py``.
http_deliveries_table = Table(
    "pm_http_deliveries",
    metadata,
    _serial_id(),
    Column("idempotency_key", String(300), nullable=False, unique=True),
    _name(nullable=False),  # the schedule's
    _at("slot_at", nullable=False),
    Column("host", String(300), nullable=False),  # the URL's host:port (pacing per host)
    Column("request", LongText, nullable=False),  # JSON: url, method, headers, secret, policy
    Column("body", LongText, nullable=False),
    Column("state", String(8), nullable=False),
    Column("attempts", Integer, nullable=False),
    _at("created_at", nullable=False),
    _at("next_attempt_at", nullable=False),
    Column("locked_by", String(64), nullable=True),
    _at("locked_until", nullable=True),
    Column("last_status", Integer, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("last_body", Text, nullable=True),  # an excerpt of the last response
    _at("finished_at", nullable=True),
    Index("ix_pm_http_deliveries_due", "state", "next_attempt_at"),
    Index("ix_pm_http_deliveries_name_id", "name", "id"),
    sqlite_autoincrement=True,
)


# An API key (periodic_manager/access.py), written by ``db/api_keys.py`` only: the SHA-256 of its
# secret (never the key), its scope, and the namespace it is of (``default`` until namespaces
# come). A revoked key keeps its row (``revoked_at``) and its name. ``last_used_at`` is written at
# most once a minute per key. Read by ``key_id`` (the id in the key's text) on every request.
api_keys_table = Table(
    "pm_api_keys",
    metadata,
    Column("key_id", String(16), primary_key=True),
    Column("name", String(64), nullable=False, unique=True),
    Column("namespace", String(64), nullable=False, server_default="default"),
    Column("scope", String(16), nullable=False),
    Column("secret_sha256", String(64), nullable=False),
    _at("created_at", nullable=False),
    _at("expires_at", nullable=True),
    _at("revoked_at", nullable=True),
    _at("last_used_at", nullable=True),
)
