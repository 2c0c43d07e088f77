"""``GET /entries`` shows the next slot that is sent, as every other preview (issue 37): one on
a date ``options.exclude`` holds is passed over, as the dashboard and ``next_runs`` pass it over
(a manager in the API's process, PostgreSQL, a virtual clock)."""

from __future__ import annotations

import pytest

from tests.runtime.test_last_good import running
from tests.support.e2e import at, iso

pytestmark = pytest.mark.parametrize("backend", ["postgresql"], indirect=True)


async def test_entries_pass_over_an_excluded_date_as_next_runs_and_the_dashboard(
    db_url: str,
) -> None:
    async with running(db_url, at(12, 0, 30)) as rig:
        r = await rig.client.put("/calendars/may-day", json={"dates": ["2024-05-01"]})
        assert r.status_code in (200, 201), r.text
        body = {"name": "hourly", "spec": "0 * * * *", "task_type": "t"}
        r = await rig.client.post("/schedules", json={**body, "options": {"exclude": ["may-day"]}})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        first = "2024-05-02T00:00:00Z"  # 13:00 to 23:00 on 1 May are excluded
        assert r.json()["next_runs"][0] == first
        await rig.advance_to(at(12, 1))
        [entry] = (await rig.client.get("/entries", params={"schedule_id": sid})).json()["items"]
        assert entry["status"] == "active" and entry["next_slot"] == first, entry
        shown = await rig.client.get(f"/views/schedules/{sid}/slots", params={"n": 20})
        slots = shown.json()["slots"]
        assert [s["at"] for s in slots if "excluded" not in s["marks"]][0] == first
        assert slots[0]["at"] == iso(at(13, 0)) and "excluded" in slots[0]["marks"]
