"""Every seam of periodic_manager: a Protocol with its contract written on it, and the values that
cross it, one module per seam (``clock``, ``providers``, ``targets``, ``store``, ``last_good``,
``failures``, ``coordination``, ``handle``); every name is imported from here.

The engine and the runtime depend on these and on nothing behind them; an adapter (the database,
Redis, Celery, arq, PostgreSQL's advisory locks and LISTEN) implements them. A capability beyond
the required methods is a Protocol of its own (:class:`IncrementalProvider`,
:class:`StagedTarget`, :class:`Pingable`, :class:`Forgetful`, :class:`EntryAnnouncer`),
checked once where the parts are put together, never probed where it is used.

::

    ConfigProvider ──configs──► manager ──tasks──► Target
        (IncrementalProvider)      │                  (StagedTarget, Pingable, Forgetful,
                                   │                   EntryAnnouncer)
                                   ├──records──► RuntimeStore (LastGoodStore)
                                   ├──asks─────► Leadership
                                   └──woken by─► ChangeSignal
    everything reads time from a Clock; the API drives an in-process manager as a ManagerHandle
"""

from periodic_manager.contracts.clock import *  # noqa: F403
from periodic_manager.contracts.coordination import *  # noqa: F403
from periodic_manager.contracts.failures import *  # noqa: F403
from periodic_manager.contracts.handle import *  # noqa: F403
from periodic_manager.contracts.last_good import *  # noqa: F403
from periodic_manager.contracts.providers import *  # noqa: F403
from periodic_manager.contracts.store import *  # noqa: F403
from periodic_manager.contracts.targets import *  # noqa: F403
