"""Config providers."""

from periodic_manager.providers.base import (
    ChangeSet,
    ConfigProvider,
    IncrementalProvider,
    ProviderSnapshot,
    RowError,
    StaticProvider,
)

__all__ = ["ChangeSet", "ConfigProvider", "IncrementalProvider", "ProviderSnapshot", "RowError", "StaticProvider"]
