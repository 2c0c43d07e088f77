"""Every API route answers 2xx/4xx, never 500, on every hostile row written with raw SQL
(tests/support/rawsql.py), on each backend that can hold the row; such a row is listed and shown with
the field at fault, can be repaired with PATCH and removed with DELETE."""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import quote

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.clock import VirtualClock
from periodic_manager.db.engine import create_engine
from tests.conftest import backend_url
from tests.support import rawsql
from tests.support.api import JOB, T0, api_client
from tests.support.rawsql import Case

PAIRS = rawsql.all_cases()


@pytest.fixture(params=PAIRS, ids=[rawsql.case_id(p) for p in PAIRS])
def hostile(request: pytest.FixtureRequest) -> tuple[str, Case]:
    """(database URL, case): a fresh, migrated database of the case's backend."""
    backend, case = request.param
    url = backend_url(request, backend, migrated=True)
    return url, case


@pytest.fixture
async def api(hostile: tuple[str, Case]) -> AsyncIterator[tuple[httpx.AsyncClient, str, Case]]:
    url, case = hostile
    engine: AsyncEngine = create_engine(url)
    try:
        async with api_client(url, VirtualClock(T0), engine) as client:
            yield client, url, case
    finally:
        await engine.dispose()


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """The API on a migrated database of each backend (as tests/api/conftest.py's client)."""
    engine = create_engine(db_url)
    try:
        async with api_client(db_url, VirtualClock(T0), engine) as c:
            yield c
    finally:
        await engine.dispose()


def ok(r: httpx.Response, status: int) -> dict[str, object]:
    assert r.status_code == status, (r.status_code, r.text[:500])
    return r.json() if r.content else {}


def names_field(r: httpx.Response, status: int, field: str) -> None:
    """A problem whose errors name ``field`` (first item) — never a 500."""
    body = ok(r, status)
    errors = body["errors"]
    assert isinstance(errors, list) and errors[0]["field"] == field, body


async def test_every_route_answers_on_a_hostile_row_which_patch_repairs_and_delete_removes(
    api: tuple[httpx.AsyncClient, str, Case],
) -> None:
    client, url, case = api
    good = await rawsql.insert(url, "good.before")
    bad = await rawsql.insert(url, "hostile.row", **case.columns)
    good_after = await rawsql.insert(url, "good.after")
    readable_name = "name" not in case.columns

    # Listed for everyone, with its errors; the good rows have none.
    page = ok(await client.get("/schedules"), 200)
    by_id = {item["id"]: item for item in page["items"]}  # type: ignore[index]
    assert page["total"] == 3 and set(by_id) == {good, bad, good_after}
    assert by_id[good]["errors"] == [] and by_id[good_after]["errors"] == []
    row = by_id[bad]
    assert row["errors"][0]["field"] == case.field and row["errors"][0]["source"] == "api"
    assert isinstance(row["options"], dict)  # always an object
    # A payload or options shown as null / {} comes with what is stored, when that is UTF-8
    # text of at most 64 KiB (the 70 kB payload and the non-UTF-8 bytes are not repeated).
    literal = case.columns.get(case.field, "") if case.field in ("payload", "options") else ""
    quoted = literal.startswith("'") and len(literal) - 2 <= 65536
    stored = literal[1:-1] if quoted else None
    if case.label == "payload-5000-digits" and url.startswith("sqlite"):
        stored = "Inf"  # SQLite's numeric affinity stored the 5,000 digits as a REAL
    assert row["errors"][0]["stored"] == stored, row["errors"][0]
    for other in ("enabled=true", "enabled=false", "task_type=t", "queue=default", "name_prefix=h"):
        ok(await client.get(f"/schedules?{other}"), 200)

    # The dashboard's views read rows the same way: listed in every order, with the error.
    for sort in ("next", "name", "id"):
        view = ok(await client.get(f"/views/schedules?sort={sort}"), 200)
        [mine] = [item for item in view["items"] if item["id"] == bad]  # type: ignore[union-attr]
        assert mine["error"].startswith(f"{case.field}: ") and mine["next"] is None, mine
    slots = ok(await client.get(f"/views/schedules/{bad}/slots"), 200)
    assert slots["slots"] == [] and slots["error"].startswith(f"{case.field}: "), slots

    # Detail, by name, runs: shown with the same judgement.
    detail = ok(await client.get(f"/schedules/{bad}"), 200)
    assert detail["errors"][0] == row["errors"][0] and detail["next_runs"] == []  # type: ignore[index]
    if readable_name:
        by_name = ok(await client.get("/schedules/by-name/hostile.row"), 200)
        assert by_name["id"] == bad
    ok(await client.get(f"/schedules/{bad}/runs"), 200)

    # A manual trigger refuses what a manager would refuse.
    names_field(await client.post(f"/schedules/{bad}/trigger"), 409, case.field)

    # PATCH validates the merged row: a change elsewhere names the field still at fault.
    names_field(
        await client.patch(f"/schedules/{bad}", json={"description": "a note"}), 422, case.field
    )

    # Pause always works; resume refuses a row no manager could use.
    paused = ok(await client.post(f"/schedules/{bad}/pause"), 200)
    assert paused["enabled"] is False
    resumed = await client.post(f"/schedules/{bad}/resume")
    if case.field == "enabled":  # pausing wrote a proper false: the content was fine all along
        assert ok(resumed, 200)["errors"] == []
    else:
        names_field(resumed, 422, case.field)

    # The repair: PATCH the bad field; the row is then clean, and resumes with its slots.
    repaired = ok(await client.patch(f"/schedules/{bad}", json=case.repair), 200)
    assert repaired["errors"] == [], repaired
    resumed_body = ok(await client.post(f"/schedules/{bad}/resume"), 200)
    assert resumed_body["enabled"] is True and resumed_body["next_runs"], resumed_body
    assert ok(await client.get(f"/schedules/{bad}"), 200)["errors"] == []

    # And removal of a hostile row (written again), whatever it holds.
    columns = case.columns if readable_name else {**case.columns, "name": "X'FE01'"}
    again = await rawsql.insert(url, "hostile.again", **columns)
    ok(await client.delete(f"/schedules/{again}"), 204)
    ok(await client.get(f"/schedules/{again}"), 404)
    ok(await client.delete(f"/schedules/{bad}"), 204)
    assert ok(await client.get("/schedules"), 200)["total"] == 2


async def test_if_match_works_on_a_hostile_row(api: tuple[httpx.AsyncClient, str, Case]) -> None:
    client, url, case = api
    bad = await rawsql.insert(url, "hostile.row", **case.columns)
    first = await client.get(f"/schedules/{bad}")
    tag = first.headers["etag"]
    assert tag == (await client.get(f"/schedules/{bad}")).headers["etag"]
    ok(await client.delete(f"/schedules/{bad}", headers={"If-Match": '"stale"'}), 412)
    ok(await client.delete(f"/schedules/{bad}", headers={"If-Match": tag}), 204)


async def test_nul_in_a_query_or_path_value_is_422_naming_it(client: httpx.AsyncClient) -> None:
    for param in ("name_prefix", "task_type", "queue"):
        r = await client.get("/schedules", params={param: "a\x00b"})
        names_field(r, 422, param)
        assert r.json()["errors"][0]["location"] == "query"
    r = await client.get("/schedules/by-name/" + quote("a\x00b"))
    names_field(r, 422, "name")
    assert r.json()["errors"][0]["location"] == "path"
    r = await client.get("/cron/next", params={"spec": "* * * * *", "tz": "UTC\x00"})
    names_field(r, 422, "tz")


async def test_nul_in_a_dashboard_filter_is_422_naming_it_never_500(
    client: httpx.AsyncClient,
) -> None:
    """The dashboard's filters reach the database as /schedules' do: NUL is refused the same way
    (PostgreSQL's driver failed the query: a 500), whatever the order asked for."""
    ok(await client.post("/schedules", json=JOB), 201)  # a row: the filters are applied
    for sort in ("next", "name", "id"):
        for param in ("name_prefix", "task_type", "queue"):
            r = await client.get("/views/schedules", params={param: "a\x00b", "sort": sort})
            names_field(r, 422, param)
            assert r.json()["errors"][0]["location"] == "query"
    r = await client.get("/views/entries", params={"manager_id": "m\x00"})
    names_field(r, 422, "manager_id")
    # What a URL can carry otherwise is taken (an invalid UTF-8 escape arrives as U+FFFD).
    for value in ("\u00e9t\u00e9", "\U0001f600", "%", "_", "'"):
        for param in ("name_prefix", "task_type", "queue"):
            ok(await client.get("/views/schedules", params={param: value}), 200)
        ok(await client.get("/views/entries", params={"manager_id": value}), 200)
    ok(await client.get("/views/schedules?name_prefix=%ED%A0%80&task_type=%FF"), 200)


async def test_cron_preview_with_an_anchor_at_year_1_east_of_utc_is_422(
    client: httpx.AsyncClient,
) -> None:
    for anchor in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:00:00-14:00"):
        r = await client.get("/cron/next", params={"spec": "@every 1h", "anchor": anchor})
        names_field(r, 422, "anchor")
        assert "between 0001-01-02 and 9999-12-30" in r.json()["errors"][0]["reason"]
