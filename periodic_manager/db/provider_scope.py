"""Which rows of ``periodic_jobs`` a :class:`~periodic_manager.db.provider.DatabaseProvider`
reads: every row, or (restricted, ``PM_COORDINATION=partitions``) only those of the partitions
the manager holds at each read, with the parameters, the runs of a read of every column, and the
digest of what a full read lists, for the partitions held."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, Integer, Select, any_, bindparam, func, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncConnection

from periodic_manager.contracts import HeldPartitions, RowError
from periodic_manager.db.models import jobs_table
from periodic_manager.db.partitions import partition_sql
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.schedules.partition import partition_of

# A manager holding every partition reads every row at its start in this many runs, each a
# range of partitions, in partition order: the partitions it hands over when other managers
# join (the highest first) are read last, so a join during the read skips their runs, and after
# it their entries lie together in memory and are given back (not interleaved with those kept).
EVERY_RUNS = 4


class PartitionScope:
    """The reads of a provider and the partitions they cover (the provider builds the reads of
    every row; :meth:`restrict` narrows them to the partitions held)."""

    _bytes: bool  # SQLite or MariaDB/MySQL: no partitions there
    _held: HeldPartitions | None  # set by restrict()
    _full: Select  # every column of the rows read
    _changed: Select  # every column of the rows written since a revision
    _revisions: Select  # (id, revision) of the rows read
    _digest: Select  # the digest of what _revisions lists
    _every_full: Select  # the unfiltered reads, used while every partition is held
    _every_revisions: Select
    _every_digest: Select
    _some: Select  # the rows of the partitions taken
    _run: Select  # the rows of a range of partitions

    def restrict(self, held: HeldPartitions) -> None:
        """Read only the rows of the partitions ``held()`` names at each read (PostgreSQL; see
        :mod:`periodic_manager.schedules.partition`). Tombstones are not filtered: removing a
        schedule this manager does not hold changes nothing."""
        if self._bytes:
            raise ValueError(
                "partitions need PostgreSQL; on SQLite and MariaDB/MySQL one manager holds every schedule"
            )
        self._held = held
        mine = self._mine()
        # Not ordered: the planner cannot tell how many rows ``id % n`` keeps and sorted a
        # whole table before the first row came (a read then did not overlap its judging); the
        # configs and errors are sorted once read.
        self._full = self._full.where(mine).order_by(None)
        self._changed = self._changed.where(mine)
        self._revisions = self._revisions.where(mine).order_by(None)
        self._digest = digest_of(self._revisions)
        self._some = self._full.where(self._mine("taken_partitions"))
        part = partition_sql(jobs_table.c.id, bindparam("partition_count", type_=Integer))
        self._run = self._every_full.where(
            part >= bindparam("run_from", type_=Integer), part < bindparam("run_to", type_=Integer)
        ).order_by(None)

    @staticmethod
    def _mine(parts: str = "held_partitions") -> ColumnElement[bool]:
        t = jobs_table.c
        count = bindparam("partition_count", type_=Integer)
        return partition_sql(t.id, count) == any_(bindparam(parts, type_=ARRAY(Integer)))

    def _every(self) -> bool | None:
        """None when not restricted; else whether every partition is held now (a manager
        alone): its reads are then those of an unrestricted provider, without the filter."""
        return None if self._held is None else self._held().every

    def _cold_reads(self, every: bool | None, full: Select[Any]) -> list[_ColdRead]:
        """The queries of a read of every column: with every partition held, EVERY_RUNS runs of
        partitions in partition order; else one query."""
        if not every or self._held is None:
            return [_ColdRead(full, {} if every else self._scope(), None)]
        count = self._held().count
        size = -(-count // EVERY_RUNS)
        runs = [range(lo, min(count, lo + size)) for lo in range(0, count, size)]
        return [
            _ColdRead(
                self._run, {"partition_count": count, "run_from": r.start, "run_to": r.stop}, r
            )
            for r in runs
        ]

    def _scope_now(self) -> Scope:
        """What a full read covers now: None (every row), or the partitions held of how many."""
        if self._held is None:
            return None
        held = self._held()
        return (held.count, held.partitions)

    async def _digest_now(self, conn: AsyncConnection, every: bool | None) -> tuple[Any, ...]:
        query = self._every_digest if every else self._digest
        return tuple((await conn.execute(query, {} if every else self._scope())).one())

    def _reading(self) -> _Reading:
        """A read of rows beginning now (see :class:`_Reading`)."""
        return _Reading(self._held)

    def _nothing_held(self) -> bool:
        return self._held is not None and not self._held().partitions

    def _scope(self, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """``params`` and, when restricted, the partitions held now."""
        out = dict(params or {})
        if self._held is not None:
            held = self._held()
            out.update(partition_count=held.count, held_partitions=sorted(held.partitions))
        return out


# What a full read covered: None (every row, not restricted), or (partition count, held).
Scope = tuple[int, frozenset[int]] | None


def digest_of(listing: Select[Any]) -> Select[Any]:
    """The count and the sum of ``hashint8extended(id, revision)`` of the rows ``listing``
    lists (its filters by construction: the digest and the listing cannot drift apart)."""
    pairs = listing.order_by(None).subquery()
    hashed = func.hashint8extended(pairs.c.id, pairs.c.revision)
    return select(func.count(), func.coalesce(func.sum(hashed), 0))


class _ColdRead(NamedTuple):
    """One query of a read of every column: its parameters, and the run of partitions it reads
    (None: the partitions held, or every row)."""

    query: Select[Any]
    params: dict[str, Any]
    partitions: range | None


class _Reading:
    """A read of the rows of the partitions held when it began. A partition handed over while
    it runs (a manager joined: a manager alone reading every row at its start, a takeover
    reading its share) is read no further: what was read of it goes at once, and the rest of
    the read keeps only the rows of the partitions still held, so the read never holds much
    more than this manager's share (the reconciler's ``keep`` would drop them anyway, but only
    after every row was read)."""

    def __init__(self, held: HeldPartitions | None) -> None:
        self._held = held  # None: not restricted (every row is this manager's)
        # The partitions the read covers, and those whose rows it keeps since the last part.
        self._began = self._kept = held().partitions if held is not None else frozenset[int]()

    def any_held(self, partitions: range | None) -> bool:
        """Whether a read of ``partitions`` (None: of whatever is held) still covers a
        partition held."""
        if self._held is None or partitions is None:
            return True
        return any(p in partitions for p in self._held().partitions)

    def still_held(
        self, part: Sequence[Any], configs: list[PeriodicTaskConfig], errors: list[RowError]
    ) -> Sequence[Any]:
        """``part`` (raw rows, the id first) less the rows of partitions handed over since the
        read began; when one is, ``configs`` and ``errors`` lose what was read of it too."""
        if self._held is None:
            return part
        now = self._held()
        if now.partitions >= self._began:
            return part  # none handed over (at rest: one comparison per part of rows)
        count, mine = now.count, now.partitions

        def kept(ident: object) -> bool:
            return isinstance(ident, int) and partition_of(ident, count) in mine

        if mine != self._kept:
            self._kept = mine
            configs[:] = [c for c in configs if kept(c.schedule_id)]
            errors[:] = [e for e in errors if kept(e.schedule_id)]
        return [raw for raw in part if kept(raw[0])]
