"""API keys with scopes: the scope of every route (the OpenAPI document walked with every scope),
``/keys`` (created, shown once, stored as a hash, revoked from the next request), expiry,
``last_used_at`` written at most once a minute, the constant-time comparison, and the guess
limiter counting wrong keys. Real databases; the app's virtual clock decides every instant."""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.access import Scope, split_key
from periodic_manager.api import auth, create_app
from periodic_manager.api.auth import GUESSES, KEYS_RECHECK_S, OPEN_PATHS, UI_PATHS, UI_PREFIX
from periodic_manager.api.scopes import OPEN, SCOPES
from periodic_manager.clock import VirtualClock
from periodic_manager.db import api_keys
from periodic_manager.db.engine import create_engine
from periodic_manager.db.models import api_keys_table
from periodic_manager.settings import Settings
from tests.support.api import T0, assert_problem, iso

TOKEN = "s3cret-admin-token"
READ_TOKEN = "s3cret-read-token"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def app_client(
    settings: Settings, clock: VirtualClock, engine: AsyncEngine
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, clock=clock, engine=engine)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            yield c


async def make_key(engine: AsyncEngine, name: str, scope: Scope, **kw: Any) -> str:
    async with engine.connect() as conn:
        _, text = await api_keys.create(conn, name, scope, T0, **kw)
    return text


async def stored(engine: AsyncEngine, name: str) -> dict[str, Any]:
    async with engine.connect() as conn:
        row = (
            await conn.execute(select(api_keys_table).where(api_keys_table.c.name == name))
        ).first()
    assert row is not None
    return dict(row._mapping)


# --- the scope of every route ------------------------------------------------------------------


def _concrete(path: str) -> str:
    """A path template with its parameters filled: an id no row has, a name no row has."""
    return re.sub(r"\{[^}]+\}", lambda m: "999999" if m.group(0).endswith("id}") else "nope", path)


async def test_every_operation_of_the_openapi_document_is_checked_with_every_scope(
    migrated_pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Each operation, for keys of each scope and both tokens: allowed -> neither 401 nor 403;
    refused -> 403. Every operation is in the table (none unchecked), open ones need nothing."""
    caplog.set_level(logging.DEBUG)
    engine = create_engine(migrated_pg_url)
    clock = VirtualClock(T0)
    try:
        callers: dict[str, tuple[str, Scope]] = {
            "PM_API_TOKEN": (TOKEN, Scope.ADMIN),
            "PM_API_READ_TOKEN": (READ_TOKEN, Scope.READ),
        }
        for scope in Scope:
            callers[f"key {scope.value}"] = (await make_key(engine, f"k-{scope}", scope), scope)
        settings = Settings(
            database_url=migrated_pg_url, api_token=TOKEN, api_read_token=READ_TOKEN
        )
        async for c in app_client(settings, clock, engine):
            document = (await c.get("/openapi.json", headers=bearer(READ_TOKEN))).json()
            operations = [
                (method.upper(), path) for path, ops in document["paths"].items() for method in ops
            ]
            assert len(operations) >= 30
            missing = [op for op in operations if op not in SCOPES]
            assert missing == [], f"routes without a scope in api/scopes.py: {missing}"
            checked = 0
            for method, path in operations:
                need = SCOPES[(method, path)]
                url = _concrete(path)
                body = {} if method in ("POST", "PUT", "PATCH") else None
                if need is OPEN:
                    assert path in OPEN_PATHS or path in UI_PATHS or path.startswith(UI_PREFIX)
                    r = await c.request(method, url, json=body)
                    assert r.status_code not in (401, 403), (method, path, r.text)
                    continue
                assert isinstance(need, Scope)
                assert (await c.request(method, url, json=body)).status_code == 401, path
                for who, (token, scope) in callers.items():
                    r = await c.request(method, url, json=body, headers=bearer(token))
                    if scope.allows(need):
                        assert r.status_code not in (401, 403), (who, method, path, r.text)
                    else:
                        problem = assert_problem(r, 403)
                        assert need.value in problem["detail"], problem
                    checked += 1
            assert checked >= 6 * 28
        secrets_ = [t for t, _ in callers.values()]
        assert not any(s in rec.getMessage() for rec in caplog.records for s in secrets_)
    finally:
        await engine.dispose()


async def test_routes_outside_the_document_and_unknown_paths(
    migrated_pg_url: str,
) -> None:
    engine = create_engine(migrated_pg_url)
    try:
        read = await make_key(engine, "reader", Scope.READ)
        settings = Settings(database_url=migrated_pg_url)  # no token: the key turns auth on
        async for c in app_client(settings, VirtualClock(T0), engine):
            for path in ("/docs", "/docs/assets/swagger-ui.css", "/openapi.json", "/nowhere"):
                assert_problem(await c.get(path), 401)  # 401 before 404: nothing revealed
            assert (await c.get("/docs", headers=bearer(read))).status_code == 200
            assert (await c.get("/openapi.json", headers=bearer(read))).status_code == 200
            assert_problem(await c.get("/nowhere", headers=bearer(read)), 404)
            assert (await c.get("/healthz")).status_code == 200
            assert (await c.get("/ui")).status_code == 200  # the dashboard's shell is open
            assert (await c.get("/ui/schedules/3")).status_code == 200
            assert (await c.get("/ui/static/0/app.js")).status_code == 200
            who = (await c.get("/views/whoami", headers=bearer(read))).json()
            assert who == {"auth": True, "can_write": False, "scope": "read", "key": "reader"}
    finally:
        await engine.dispose()


# --- /keys -------------------------------------------------------------------------------------


async def test_keys_created_shown_once_stored_as_a_hash_and_revoked_from_the_next_request(
    db_url: str, engine: AsyncEngine, clock: VirtualClock
) -> None:
    settings = Settings(database_url=db_url, api_token=TOKEN)
    admin = bearer(TOKEN)
    async for c in app_client(settings, clock, engine):
        r = await c.post("/keys", json={"name": "ci-deployer", "scope": "write"}, headers=admin)
        assert r.status_code == 201, r.text
        created = r.json()
        key = created["key"]
        parts = split_key(key)
        assert parts is not None and parts[0] == created["key_id"]
        assert created["scope"] == "write" and created["state"] == "active"
        assert created["namespace"] == "default" and created["expires_at"] is None

        row = await stored(engine, "ci-deployer")
        assert row["secret_sha256"] == hashlib.sha256(parts[1].encode()).hexdigest()
        assert not any(parts[1] in str(v) for v in row.values())  # the secret is nowhere

        listed = (await c.get("/keys", headers=admin)).json()["items"]
        assert [k["name"] for k in listed] == ["ci-deployer"]
        assert "key" not in listed[0] and parts[1] not in str(listed)

        assert (await c.post("/schedules", json={}, headers=bearer(key))).status_code == 422
        assert_problem(await c.get("/keys", headers=bearer(key)), 403)  # write < admin

        assert (await c.delete("/keys/ci-deployer", headers=admin)).status_code == 204
        assert_problem(await c.get("/schedules", headers=bearer(key)), 401)
        listed = (await c.get("/keys", headers=admin)).json()["items"]
        assert listed[0]["state"] == "revoked" and listed[0]["revoked_at"] == iso(T0)
        assert_problem(await c.delete("/keys/nope", headers=admin), 404)

        dup = await c.post("/keys", json={"name": "ci-deployer", "scope": "read"}, headers=admin)
        assert assert_problem(dup, 409)["type"].endswith("name-conflict")
        for body, field in (
            ({"name": "x", "scope": "root"}, "scope"),
            ({"name": "bad name", "scope": "read"}, "name"),
            ({"name": "x", "scope": "read", "expires_at": iso(T0)}, "expires_at"),
            ({"name": "x", "scope": "read", "expires_at": "tomorrow"}, "expires_at"),
        ):
            problem = assert_problem(await c.post("/keys", json=body, headers=admin), 422)
            assert problem["errors"][0]["field"] == field, problem


async def test_an_expired_key_is_refused(
    db_url: str, engine: AsyncEngine, clock: VirtualClock
) -> None:
    settings = Settings(database_url=db_url, api_token=TOKEN)
    async for c in app_client(settings, clock, engine):
        body = {"name": "short", "scope": "read", "expires_at": iso(T0 + timedelta(hours=1))}
        key = (await c.post("/keys", json=body, headers=bearer(TOKEN))).json()["key"]
        assert (await c.get("/schedules", headers=bearer(key))).status_code == 200
        await clock.advance(3600)
        assert_problem(await c.get("/schedules", headers=bearer(key)), 401)
        listed = (await c.get("/keys", headers=bearer(TOKEN))).json()["items"]
        assert listed[0]["state"] == "expired"


async def test_last_used_at_is_written_at_most_once_a_minute(
    db_url: str, engine: AsyncEngine, clock: VirtualClock
) -> None:
    key = await make_key(engine, "busy", Scope.READ)
    async for c in app_client(Settings(database_url=db_url), clock, engine):
        assert (await stored(engine, "busy"))["last_used_at"] is None
        assert (await c.get("/schedules", headers=bearer(key))).status_code == 200
        assert (await stored(engine, "busy"))["last_used_at"] == T0
        await clock.advance(59)
        for _ in range(5):
            assert (await c.get("/schedules", headers=bearer(key))).status_code == 200
        assert (await stored(engine, "busy"))["last_used_at"] == T0
        await clock.advance(1)
        assert (await c.get("/schedules", headers=bearer(key))).status_code == 200
        assert (await stored(engine, "busy"))["last_used_at"] == T0 + timedelta(seconds=60)


async def test_a_key_turns_auth_on_and_revoking_every_key_does_not_turn_it_off(
    db_url: str, engine: AsyncEngine, clock: VirtualClock
) -> None:
    async for c in app_client(Settings(database_url=db_url), clock, engine):
        assert (await c.get("/schedules")).status_code == 200  # no token, no key: open
        # A key made elsewhere (the CLI, another process) is seen within KEYS_RECHECK_S.
        key = await make_key(engine, "first", Scope.ADMIN)
        await clock.advance(KEYS_RECHECK_S)
        assert_problem(await c.get("/schedules"), 401)
        assert (await c.delete("/keys/first", headers=bearer(key))).status_code == 204
        assert_problem(await c.get("/schedules", headers=bearer(key)), 401)
        await clock.advance(KEYS_RECHECK_S)
        assert_problem(await c.get("/schedules"), 401)  # still on: only a revoked key left


async def test_keys_are_compared_in_constant_time_and_wrong_ones_are_guesses(
    db_url: str,
    engine: AsyncEngine,
    clock: VirtualClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    key = await make_key(engine, "victim", Scope.READ)
    key_id, secret = split_key(key) or ("", "")
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    async for c in app_client(Settings(database_url=db_url), clock, engine):
        assert (await c.get("/schedules", headers=bearer(key))).status_code == 200
        sha = hashlib.sha256(secret.encode()).hexdigest().encode()
        assert (sha, sha) in compared  # the stored digest, through hmac.compare_digest
        wrong = [f"pmk_{key_id}_{'A' * 42}{i % 10}" for i in range(GUESSES)]
        for guess in wrong:
            assert_problem(await c.get("/schedules", headers=bearer(guess)), 401)
        for token in (wrong[0], key):  # held back: a right key too, until the window ends
            assert_problem(await c.get("/schedules", headers=bearer(token)), 429)
        await clock.advance(auth.GUESS_WINDOW_S)
        assert (await c.get("/schedules", headers=bearer(key))).status_code == 200
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "wrong API tokens" in said and secret not in said and "A" * 42 not in said
    assert f"wrong secret for API key victim ({key_id})" in said  # the name and id, no secret


async def test_an_app_beyond_loopback_warns_unless_an_active_admin_key_exists(
    migrated_pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine = create_engine(migrated_pg_url)
    settings = Settings(database_url=migrated_pg_url, host="0.0.0.0")

    async def warned() -> bool:
        caplog.clear()
        app = create_app(settings, clock=VirtualClock(T0), engine=engine)
        with caplog.at_level(logging.WARNING, logger="periodic_manager.api.auth"):
            async with app.router.lifespan_context(app):
                pass
        return any("no active admin key" in r.getMessage() for r in caplog.records)

    try:
        assert await warned()
        await make_key(engine, "reader", Scope.READ)
        assert await warned()  # a read key does not count
        await make_key(engine, "root", Scope.ADMIN, expires_at=T0 + timedelta(days=1))
        assert not await warned()
    finally:
        await engine.dispose()


def test_a_route_missing_from_the_table_needs_admin_and_head_is_get() -> None:
    from periodic_manager.api.scopes import needed

    assert needed("GET", "/not/in/the/table") is Scope.ADMIN
    assert needed("HEAD", "/schedules") is Scope.READ
    assert needed("POST", "/schedules/{schedule_id}/trigger") is Scope.TRIGGER
    assert [s.value for s in Scope] == ["read", "trigger", "write", "admin"]
    assert Scope.WRITE.allows(Scope.TRIGGER) and not Scope.TRIGGER.allows(Scope.WRITE)


def _routes(routes: list[Any]) -> list[tuple[str, str, bool]]:
    """(method, path template, in the OpenAPI document) of every route the app serves, included
    routers opened (FastAPI builds their routes lazily: ``effective_candidates``)."""
    found: list[tuple[str, str, bool]] = []
    for route in routes:
        inner = getattr(route, "effective_candidates", None)
        if inner is not None:
            found += _routes(inner())
            continue
        for method in getattr(route, "methods", None) or ():
            if method != "HEAD":
                shown = bool(getattr(route, "include_in_schema", True))
                found.append((method, str(route.path_format), shown))
    return found


def test_every_route_the_app_serves_is_in_the_table_open_ones_are_the_middlewares() -> None:
    """The walk of the OpenAPI document misses the routes it does not show (Swagger UI, the
    dashboard): every route, shown or not, is in the table, and a route the table calls OPEN is
    one the middleware lets through without a token (else its answer would be 401 for all)."""
    app = create_app(Settings())
    served = _routes(list(app.router.routes))
    assert len(served) >= 35 and any(not shown for _, _, shown in served)
    assert [(m, p) for m, p, _ in served if (m, p) not in SCOPES and p != "/openapi.json"] == []
    for method, path, _ in served:
        if SCOPES.get((method, path)) is OPEN:
            assert path in OPEN_PATHS or path in UI_PATHS or path.startswith(UI_PREFIX), path
