"""The REST API of periodic_manager: edit ``periodic_jobs`` rows and inspect running managers.

Build it with :func:`create_app`; nothing is created at import time. An in-process manager is a
:class:`periodic_manager.contracts.ManagerHandle`.
"""

from .app import create_app

__all__ = ["create_app"]
