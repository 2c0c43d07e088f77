"""The database: the only code that speaks SQL to the schedule tables and the runtime store's
tables (the schema itself is owned by ``migrations/``).

``periodic_jobs`` rows, untrusted: ``rows`` reads their columns raw, ``judge`` judges them (the
manager's verdict, which the API shows), ``view`` shows them to people. ``changes`` is the change
feed (watermark, tombstones, rows written since), followed by ``provider`` (the manager's
:class:`~periodic_manager.contracts.IncrementalProvider`; ``provider_scope``: the rows of the
partitions it holds) and by the dashboard.
``schedule_reader`` reads rows for the API's lists and pages; ``schedule_writer`` is the one
writer of rows (stamps, names, locking, deletion with what is kept of a row), for the API and the
import; ``stored`` reads and writes a row's columns as stored.

What managers publish: ``store`` is the :class:`~periodic_manager.contracts.RuntimeStore`
(with ``managers`` for ``pm_managers`` and the heartbeat, ``entry_writes`` for ``pm_entries``,
``schedule_state`` for ``pm_schedule_state``, ``history`` for ``pm_runs`` and ``last_good`` for
``pm_last_good``), ``store_reads`` its read side (``runtime_rows`` decodes the rows), ``stats``
the aggregates of the overview and the metrics.

``engine`` makes engines (and names what others hold: an ``Engine``, a ``Connection``), ``models``
describes the tables (``column_types``: their types on every database), ``migrate`` runs Alembic.
"""
