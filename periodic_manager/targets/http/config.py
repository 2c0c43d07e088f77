"""What the http target and its deliverer read of the settings (``PM_HTTP_*``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """What the target and its deliverer read of the settings."""

    url: str | None = None
    concurrency_per_host: int = 16
    allow_private: bool = False
    ca_bundle: str | None = None
    max_response_bytes: int = 65_536
    poll_interval: float = 1.0
    lease_margin: float = 10.0
    done_retention: float = 86_400.0
