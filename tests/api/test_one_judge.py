"""A row is judged once (periodic_manager/schedules/judge.py): the same bad values posted to the
API, written with SQL and read by the provider's row judge, and given in an import file are
refused naming the same field for the same reason, with the same code where one is shown."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.contracts import RowError
from periodic_manager.db import judge as dbjudge
from periodic_manager.db import schedule_reader
from periodic_manager.db.engine import reads_bytes
from periodic_manager.schedules import files
from tests.support import rawsql
from tests.support.api import JOB, settings_for

# Each: fields over JOB, the field the judge names. Values the columns cannot hold (a name
# longer than its column, say) cannot be written with SQL, so they are not here.
BAD: list[tuple[dict[str, Any], str]] = [
    ({"name": "bad name!"}, "name"),
    ({"spec": "61 * * * *"}, "spec"),
    ({"spec": "0 0 31 2 *"}, "spec"),
    ({"spec": "@every 36501d"}, "spec"),
    ({"timezone": "Mars/Olympus_Mons"}, "timezone"),
    ({"task_type": " "}, "task_type"),
    ({"payload": ["x" * 1000] * 70}, "payload"),
    ({"options": {"queu": "q"}}, "options.queu"),
    ({"options": {"queue": "no spaces"}}, "options.queue"),
    ({"options": {"timeout": 0}}, "options.timeout"),
    ({"options": {"max_retry": "3"}}, "options.max_retry"),
    ({"options": {"misfire": "later"}}, "options.misfire"),
    ({"options": {"overlap_timeout": 5}}, "options.overlap_timeout"),
    ({"options": {"extra": {"priority": 256}}}, "options.extra.priority"),
    ({"options": {"max_runs": 0}}, "options.max_runs"),
    ({"options": {"pause_after_failures": True}}, "options.pause_after_failures"),
    ({"options": {"start_at": "2026-05-01T00:00:00Z", "end_at": "2026-04-01T00:00:00Z"}}, ""),
    ({"options": {"jitter": 900}}, "options.jitter"),
    ({"options": {"target": "rq"}}, "options.target"),
    ({"options": {"overlap": "sometimes"}}, "options.overlap"),
    ({"options": {"exclude": "holidays"}}, "options.exclude"),
    ({"options": [1, 2]}, "options"),
]


def _literal(value: Any) -> str:
    return "'" + value.replace("'", "''") + "'"


async def _sql_verdict(db_url: str, engine: AsyncEngine, fields: dict[str, Any]) -> RowError:
    row = {**JOB, **fields}
    columns = {k: _literal(v) for k, v in row.items() if isinstance(v, str) and k != "name"}
    for key in ("payload", "options"):
        if key in row:
            columns[key] = _literal(json.dumps(row[key]))
    row_id = await rawsql.insert(db_url, row["name"], **columns)
    settings = settings_for(db_url)
    rules = dbjudge.rules_for(
        reads_bytes(engine), settings.max_payload_bytes, settings.configured_targets()
    )
    async with engine.connect() as conn:
        raw = await schedule_reader.row(conn, row_id)
    assert raw is not None
    verdict = dbjudge.RowJudge(rules)(raw)
    assert isinstance(verdict, RowError), (fields, verdict)
    return verdict


def _import_message(db_url: str, fields: dict[str, Any]) -> str:
    settings = settings_for(db_url)
    with pytest.raises(files.FileError) as caught:
        files.validate(
            [{**JOB, **fields}],
            max_payload_bytes=settings.max_payload_bytes,
            targets=settings.configured_targets(),
        )
    return str(caught.value)


async def test_api_sql_rows_and_import_judge_a_row_alike(
    client: httpx.AsyncClient, db_url: str, engine: AsyncEngine
) -> None:
    for i, (fields, field) in enumerate(BAD):
        fields = {**fields, "name": fields.get("name", f"row.{i}")}
        r = await client.post("/schedules", json={**JOB, **fields})
        assert r.status_code in (413, 422), (fields, r.text)
        api = r.json()["errors"][0]
        assert api["location"] == "body"
        row = await _sql_verdict(db_url, engine, fields)
        imported = _import_message(db_url, fields)
        expected = field or "options.end_at"
        assert (api["field"], row.field) == (expected, expected), (fields, api, row)
        assert (api["reason"], api["code"]) == (row.reason, row.code), (fields, api, row)
        assert imported.endswith(f": {row.field}: {row.reason}"), (fields, imported, row)
    # Only the rows written with SQL are there: the API wrote none.
    assert (await client.get("/schedules")).json()["total"] == len(BAD)
