"""options.jitter through a real manager (in the API's process, outbox target) on a
VirtualClock, PostgreSQL and SQLite: each slot of every jittered row reaches the outbox at its
send instant (slot + the deterministic offset), once, with the nominal scheduled_at and
idempotency key; /entries shows the nominal next slot; a row without jitter is sent at its slot."""

from __future__ import annotations

from datetime import datetime, timedelta

from periodic_manager.schedules.jitter import send_at
from tests.runtime.test_last_good import running
from tests.support.e2e import T0, at, iso


async def test_a_real_manager_sends_jittered_rows_at_their_send_instants(db_url: str) -> None:
    async with running(db_url, T0) as rig:
        ids = {}
        for i in range(20):
            job = {
                "name": f"spread.{i}",
                "spec": "* * * * *",
                "task_type": "t",
                "options": {"jitter": 45},
            }
            r = await rig.client.post("/schedules", json=job)
            assert r.status_code == 201, r.text
            assert r.json()["next_runs"][0] == iso(at(12, 1))  # previews: nominal slots
            ids[f"spread.{i}"] = r.json()["id"]
        r = await rig.client.post(
            "/schedules", json={"name": "plain", "spec": "* * * * *", "task_type": "t"}
        )
        assert r.status_code == 201, r.text
        await rig.advance_to(at(12, 1, 50))
        [published] = (
            await rig.client.get("/entries", params={"schedule_id": ids["spread.0"]})
        ).json()["items"]
        assert published["next_slot"] == iso(at(12, 2))  # nominal, not the send instant
        await rig.advance_to(at(12, 3, 50))
        messages = await rig.messages()
        for i in range(20):
            name = f"spread.{i}"
            mine = [m for m in messages if m["name"] == name]
            assert [m["scheduled_at"] for m in mine] == [iso(at(12, m)) for m in (1, 2, 3)]
            for m in mine:
                slot = datetime.fromisoformat(m["scheduled_at"])
                assert m["idempotency_key"] == f"{name}:{m['scheduled_at']}"
                sent = datetime.fromisoformat(m["enqueued_at"])
                assert sent == send_at(name, slot, 45_000_000), (name, m)
                assert slot <= sent < slot + timedelta(seconds=45)
        plain = [m for m in messages if m["name"] == "plain"]
        assert (
            [m["enqueued_at"] for m in plain]
            == [m["scheduled_at"] for m in plain]
            == [iso(at(12, m)) for m in (1, 2, 3)]
        )
        spread = {m["enqueued_at"] for m in messages if m["name"] != "plain"}
        assert len(spread) == 60  # every send at an instant of its own
