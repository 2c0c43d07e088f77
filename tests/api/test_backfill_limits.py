"""A backfill obeys ``options.exclude`` and ``options.max_runs`` as the engine does (issue 37),
through the API with a manager running in the process (outbox target, PostgreSQL, a virtual
clock): no slot on an excluded date; at most the runs left, earliest first; and the runs it used
count for the running manager too, which then sends no run past the limit."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.runtime.test_last_good import running
from tests.support.e2e import Rig, at, iso

pytestmark = pytest.mark.parametrize("backend", ["postgresql"], indirect=True)

EVERY_MINUTE = {"spec": "* * * * *", "task_type": "t"}


async def backfill(rig: Rig, sid: int, start: datetime, end: datetime) -> dict[str, Any]:
    """POST a backfill of ``[start, end)`` while the virtual clock follows its paced batches."""
    call = asyncio.ensure_future(
        rig.client.post(f"/schedules/{sid}/backfill", json={"from": iso(start), "to": iso(end)})
    )
    loop = asyncio.get_running_loop()
    until = loop.time() + 60
    while not call.done():
        assert loop.time() < until, "the backfill did not end within 60 s"
        deadline = rig.clock.next_deadline()
        step = rig.clock.now() + timedelta(seconds=0.1)
        await rig.clock.advance_to(min(deadline, step) if deadline is not None else step)
        await asyncio.sleep(0.001)
    r: httpx.Response = call.result()
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def create(rig: Rig, name: str, options: dict[str, Any]) -> int:
    r = await rig.client.post("/schedules", json={"name": name, **EVERY_MINUTE, "options": options})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


async def sent(rig: Rig, name: str) -> list[str]:
    return sorted(m["scheduled_at"] for m in await rig.messages() if m["name"] == name)


async def runs_left(rig: Rig, sid: int) -> int:
    body = (await rig.client.get(f"/schedules/{sid}")).json()
    return int(body["runs_left"])


async def test_no_slot_on_an_excluded_date_is_backfilled(db_url: str) -> None:
    async with running(db_url, at(12, 0), catchup_rate=1000) as rig:
        r = await rig.client.put("/calendars/may-day", json={"dates": ["2024-05-01"]})
        assert r.status_code in (200, 201), r.text
        sid = await create(rig, "holiday", {"exclude": ["may-day"]})
        out = await backfill(rig, sid, at(11, 0), at(12, 0))
        assert (out["slots"], out["excluded"], out["sent"]) == (60, 60, 0), out
        assert await sent(rig, "holiday") == []


async def test_max_runs_3_backfills_3_slots_earliest_first_and_the_manager_sends_none_after(
    db_url: str,
) -> None:
    async with running(db_url, at(12, 0), catchup_rate=1000) as rig:
        sid = await create(rig, "thrice", {"max_runs": 3})
        out = await backfill(rig, sid, at(11, 0), at(11, 37))
        assert (out["slots"], out["sent"], out["over_limit"]) == (37, 3, 34), out
        assert await runs_left(rig, sid) == 0
        await rig.advance_to(at(12, 5, 30))  # the running manager has no run left either
        assert await sent(rig, "thrice") == [iso(at(11, m)) for m in range(3)]
        assert await runs_left(rig, sid) == 0


async def test_with_2_runs_left_a_backfill_sends_2_and_the_manager_none_after(
    db_url: str,
) -> None:
    async with running(db_url, at(12, 0), catchup_rate=1000) as rig:
        sid = await create(rig, "thrice", {"max_runs": 3})
        await rig.advance_to(at(12, 1, 30))  # the manager sends 12:01: two runs left
        assert await sent(rig, "thrice") == [iso(at(12, 1))]
        assert await runs_left(rig, sid) == 2
        out = await backfill(rig, sid, at(11, 0), at(11, 37))
        assert (out["sent"], out["over_limit"]) == (2, 35), out
        assert await runs_left(rig, sid) == 0
        await rig.advance_to(at(12, 5, 30))
        assert await sent(rig, "thrice") == [iso(at(11, 0)), iso(at(11, 1)), iso(at(12, 1))]
