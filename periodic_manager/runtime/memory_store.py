"""The runtime store of one process, in memory: for code that runs a manager alone, and tests.

The contract (:class:`~periodic_manager.contracts.RuntimeStore`) and the values it keeps are in
:mod:`periodic_manager.contracts`; the database's store, which the API reads, is
:mod:`periodic_manager.db.store`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from periodic_manager.contracts import (
    EntryRecord,
    ManagerInfo,
    ManagerStatus,
    RunRecord,
    StateRecord,
)


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

    async def heartbeat(
        self, manager_id: str, status: ManagerStatus, *, reap_before: datetime | None = None
    ) -> int:
        info, _ = self.managers[manager_id]
        self.managers[manager_id] = (info, status)
        if reap_before is None:
            return 0
        return sum(1 for m in self._dead(reap_before) if m != manager_id)

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
            self.state.setdefault(run.schedule_key, StateRecord(run.schedule_key, run.name)).fold(
                run
            )

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

    def _dead(self, older_than: datetime) -> list[str]:
        return [m for m, (_, st) in self.managers.items() if st.heartbeat_at < older_than]

    async def reap(self, older_than: datetime, *, silence: timedelta | None = None) -> int:
        dead = self._dead(older_than)
        for manager_id in dead:
            await self.unregister_manager(manager_id)
        return len(dead)
