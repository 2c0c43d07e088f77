"""What the runtime store records of schedules with ``options.max_runs``, read when a manager
registers them (a sync) or takes over (:mod:`periodic_manager.runtime.leading`): their runs left
are taken from it (see :mod:`periodic_manager.schedules.runs`)."""

from __future__ import annotations

from collections.abc import Sequence

from periodic_manager.contracts import StateReader
from periodic_manager.engine.entries import Counted, Ident
from periodic_manager.pacing import in_turns
from periodic_manager.schedules.definition import PeriodicTaskConfig
from periodic_manager.schedules.runs import max_runs_of


async def limited(configs: Sequence[PeriodicTaskConfig]) -> list[PeriodicTaskConfig]:
    """The configs with ``options.max_runs`` (in turns with the other tasks: a million rows)."""
    out: list[PeriodicTaskConfig] = []
    async for part in in_turns(configs):
        out.extend(c for c in part if c.options and max_runs_of(c.options) is not None)
    return out


async def read_counted(
    read: StateReader, configs: list[PeriodicTaskConfig]
) -> dict[Ident, Counted]:
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
