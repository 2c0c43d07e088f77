"""Config providers."""

from periodic_manager.providers.base import ConfigProvider, ProviderSnapshot, RowError, StaticProvider

__all__ = ["ConfigProvider", "ProviderSnapshot", "RowError", "StaticProvider"]
