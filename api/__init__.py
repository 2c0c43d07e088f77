"""The REST API of periodic_manager: edit ``periodic_jobs`` rows and inspect running managers.

Build it with :func:`create_app`; nothing is created at import time.
"""

from .app import create_app
from .deps import ManagerLike

__all__ = ["ManagerLike", "create_app"]
