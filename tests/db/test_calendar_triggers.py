"""Migration 0016's triggers, on both databases: every write of ``pm_calendars`` (insert, update,
rename, delete) gives a new revision to exactly the ``periodic_jobs`` rows whose options name the
calendar (``"exclude"`` and the quoted name), so managers re-read them; other rows keep theirs."""

from __future__ import annotations

from tests.support import rawsql


async def revisions(url: str) -> dict[str, int]:
    return {
        n: int(r) for n, r in await rawsql.execute(url, "SELECT name, revision FROM periodic_jobs")
    }


async def test_a_calendar_write_renews_the_revision_of_the_rows_that_name_it(db_url: str) -> None:
    await rawsql.insert(db_url, "names.a", options="""'{"exclude": ["a"]}'""")
    await rawsql.insert(db_url, "names.ab", options="""'{"exclude": ["ab"]}'""")
    await rawsql.insert(db_url, "plain", options="""'{"queue": "a"}'""")
    before = await revisions(db_url)

    async def renewed(sql: str) -> set[str]:
        nonlocal before
        await rawsql.execute(db_url, sql)
        now = await revisions(db_url)
        changed = {n for n in now if now[n] != before[n]}
        assert all(now[n] > before[n] for n in changed)
        before = now
        return changed

    assert await renewed(
        """INSERT INTO pm_calendars (name, spec) VALUES ('a', '{"dates":[]}')"""
    ) == {"names.a"}
    assert await renewed("""UPDATE pm_calendars SET spec = '{"dates":["2030-01-01"]}'""") == {
        "names.a"
    }
    assert await renewed("UPDATE pm_calendars SET name = 'ab' WHERE name = 'a'") == {
        "names.a",
        "names.ab",
    }
    assert await renewed("DELETE FROM pm_calendars WHERE name = 'ab'") == {"names.ab"}
    assert (
        await renewed("""INSERT INTO pm_calendars (name, spec) VALUES ('z', '{"dates":[]}')""")
        == set()
    )
