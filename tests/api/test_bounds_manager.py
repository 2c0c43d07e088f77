"""options.start_at / options.end_at through a real manager (in the API's process, outbox
target) on a VirtualClock: slots begin at start_at, none is sent at or after end_at, the entry
and the schedule then show ``ended``; a row turned bad with SQL (a naive end_at) is a row error
naming the field while its last good version keeps running."""

from __future__ import annotations

import json

from tests.runtime.test_last_good import manager_errors, running
from tests.support import rawsql
from tests.support.e2e import T0, at, iso


async def test_a_real_manager_sends_nothing_before_start_at_nor_at_or_after_end_at(
    db_url: str,
) -> None:
    async with running(db_url, T0) as rig:
        job = {
            "name": "window",
            "spec": "* * * * *",
            "task_type": "t",
            "options": {"start_at": iso(at(12, 2)), "end_at": "2024-05-01T14:05:00+02:00"},
        }
        r = await rig.client.post("/schedules", json=job)
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        assert r.json()["next_runs"] == [iso(at(12, m)) for m in (2, 3, 4)]
        await rig.advance_to(at(12, 9, 30))
        # 14:05+02:00 is 12:05Z: the slot at end_at is not sent.
        assert await rig.slots("window") == [iso(at(12, m)) for m in (2, 3, 4)]
        entry = rig.manager.entry(sid)
        assert entry is not None and entry.next_slot is None and entry.last_error is None
        body = (await rig.client.get(f"/schedules/{sid}")).json()
        assert body["status"] == "ended" and body["next_runs"] == [] and body["errors"] == []
        [published] = (await rig.client.get("/entries", params={"schedule_id": sid})).json()[
            "items"
        ]
        assert published["status"] == "ended" and published["next_slot"] is None


async def test_a_bound_turned_bad_with_sql_is_a_row_error_and_the_old_version_runs(
    db_url: str,
) -> None:
    async with running(db_url, T0) as rig:
        good = json.dumps({"end_at": iso(at(13, 0))})
        sid = await rawsql.insert(db_url, "by.sql", options=f"'{good}'")
        await rig.advance_to(at(12, 1, 30))
        assert await rig.slots("by.sql") == [iso(at(12, 1))]
        naive = json.dumps({"end_at": "2024-05-01T12:03:00"})
        await rawsql.execute(
            db_url, f"UPDATE periodic_jobs SET options = '{naive}' WHERE id = {sid}"
        )
        await rig.advance_to(at(12, 4, 30))
        # The last good version (end_at 13:00) goes on: 12:03 and 12:04 are sent.
        assert await rig.slots("by.sql") == [iso(at(12, m)) for m in (1, 2, 3, 4)]
        [err] = await manager_errors(rig, sid)
        assert err["field"] == "options.end_at" and "naive" in err["reason"], err
        assert err["last_good_since"] is not None
        api = (await rig.client.get(f"/schedules/{sid}")).json()
        assert api["status"] == "error" and api["errors"][0]["field"] == "options.end_at"
