"""A provider for schedules made in code (and tests): a fixed but replaceable list of configs.

The provider contracts are in :mod:`periodic_manager.contracts`; the database's provider is
:mod:`periodic_manager.db.provider`.
"""

from __future__ import annotations

from collections.abc import Iterable

from periodic_manager.contracts import ProviderSnapshot, RowError
from periodic_manager.schedules.definition import PeriodicTaskConfig


class StaticProvider:
    """A fixed (but replaceable) list of configs, for code and tests."""

    def __init__(self, configs: Iterable[PeriodicTaskConfig] = ()) -> None:
        self.configs: list[PeriodicTaskConfig] = list(configs)
        self.errors: list[RowError] = []

    async def get_configs(self) -> ProviderSnapshot:
        return ProviderSnapshot(configs=list(self.configs), errors=list(self.errors))
