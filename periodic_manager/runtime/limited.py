"""What the runtime store records of schedules with ``options.max_runs``, read when a manager
registers them (a sync) or takes over (:mod:`periodic_manager.runtime.leading`): their runs left
are taken from it (see :mod:`periodic_manager.schedules.runs`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping

from periodic_manager.contracts import StateRecord
from periodic_manager.engine.entries import Counted, Ident
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.schedules.runs import max_runs_of

StateReader = Callable[[Iterable[str]], Awaitable[Mapping[str, StateRecord]]]


def limited(configs: Iterable[PeriodicTaskConfig]) -> list[PeriodicTaskConfig]:
    """The configs with ``options.max_runs``."""
    return [c for c in configs if c.options and max_runs_of(c.options) is not None]


async def read_counted(read: StateReader, configs: list[PeriodicTaskConfig]) -> dict[Ident, Counted]:
    """(runs counted, latest settled slot) of each config, by ident; ``(0, None)`` for one the
    store records nothing of. Raises what ``read`` raises."""
    if not configs:
        return {}
    states = await read([c.key for c in configs])
    out: dict[Ident, Counted] = {}
    for c in configs:
        st = states.get(c.key)
        out[c.ident] = (st.runs, st.last_done_at) if st is not None else (0, None)
    return out
