"""``periodic-manager keys create|list|revoke``: API keys, as ``/keys`` manages them.

``create`` prints what it made, then the key alone on the last line of its output (so a script
takes ``tail -n 1``); the key is shown this once, only its hash is stored. Bad input (a name, a
scope, an expiry, a name already taken, a key that does not exist) is one line and status 2; a
database that cannot be used, one line and status 1.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime

from periodic_manager import access
from periodic_manager.cli.files import _fail, _on_database
from periodic_manager.clock import SystemClock
from periodic_manager.contracts import Clock
from periodic_manager.db import api_keys
from periodic_manager.errors import ConfigError
from periodic_manager.settings import Settings

FLAG_OF = {"name": "--name", "scope": "--scope", "expires_at": "--expires-at"}


def run_keys(args: argparse.Namespace, settings: Settings, clock: Clock | None = None) -> int:
    clock = clock or SystemClock()
    now = clock.now()
    try:
        if args.keys_command == "create":
            name, scope, expires_at = access.key_request(
                args.name, args.scope, args.expires_at, now
            )
            return _on_database(settings, lambda: _create(settings, name, scope, expires_at, now))
        if args.keys_command == "revoke":
            return _on_database(settings, lambda: _revoke(settings, args.name, now))
        return _on_database(settings, lambda: _list(settings, now))
    except ConfigError as exc:
        return _fail(f"{FLAG_OF.get(exc.field, exc.field)}: {exc.reason}")


async def _create(
    settings: Settings,
    name: str,
    scope: access.Scope,
    expires_at: datetime | None,
    now: datetime,
) -> int:
    from periodic_manager.db.engine import create_engine

    engine = create_engine(settings.database_url)
    try:
        async with engine.connect() as conn:
            key, text = await api_keys.create(conn, name, scope, now, expires_at)
    finally:
        await engine.dispose()
    expiry = _when(key.expires_at) if key.expires_at is not None else "never"
    print(f"created API key {key.name}: scope {scope.value}, expires {expiry}")
    print("it is shown this once (only its hash is stored); send it as 'Authorization: Bearer':")
    print(text)
    return 0


async def _revoke(settings: Settings, name: str, now: datetime) -> int:
    from periodic_manager.db.engine import create_engine

    engine = create_engine(settings.database_url)
    try:
        async with engine.connect() as conn:
            key = await api_keys.revoke(conn, name, now)
    finally:
        await engine.dispose()
    if key is None:
        return _fail(f"NAME: no key named {name!r}")
    assert key.revoked_at is not None
    print(f"revoked API key {key.name} at {_when(key.revoked_at)}: refused from the next request")
    return 0


async def _list(settings: Settings, now: datetime) -> int:
    from periodic_manager.db.engine import create_engine

    engine = create_engine(settings.database_url)
    try:
        async with engine.connect() as conn:
            keys = await api_keys.read_all(conn)
    finally:
        await engine.dispose()
    if not keys:
        print("no API keys (create one: periodic-manager keys create --name NAME --scope SCOPE)")
        return 0
    rows = [("NAME", "SCOPE", "STATE", "CREATED", "EXPIRES", "LAST USED")]
    for k in keys:
        rows.append(
            (
                k.name,
                k.scope.value if k.scope is not None else "?",
                k.state(now),
                _when(k.created_at),
                _when(k.expires_at) if k.expires_at is not None else "never",
                _when(k.last_used_at) if k.last_used_at is not None else "never",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        sys.stdout.write("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
        sys.stdout.write("\n")
    return 0


def _when(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def admin_key_exists(settings: Settings, clock: Clock | None = None) -> bool:
    """Whether the database holds an active admin key, for ``run`` and ``api`` bound beyond
    loopback with no token (:func:`periodic_manager.api.auth.exposure`). Asked before the port
    is bound and before ``run`` migrates SQLite: a database that is missing, unreachable or not
    at head holds no usable key, so the command refuses as if there were none (and creates no
    SQLite file)."""
    from periodic_manager.api.auth import admin_key_in
    from periodic_manager.db.engine import create_engine
    from periodic_manager.runtime.startup import StartupError, check_database

    try:
        await check_database(settings.database_url)
    except StartupError:
        return False
    engine = create_engine(settings.database_url)
    try:
        return await admin_key_in(engine, (clock or SystemClock()).now())
    finally:
        await engine.dispose()
