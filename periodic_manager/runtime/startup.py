"""What a process checks before it starts work, and how it says what went wrong in one line.

Every long-running command (``run``, ``api``, ``manager``) and every command that touches the
database (``migrate``, ``import``, ``export``) first connects once: a wrong password, a missing
database, an unreachable server or a schema that is not at this version's head ends the command
with one line naming the database (password hidden) and the cause, and a non-zero exit, instead
of a traceback or a loop of retries. A command that sends (``manager``, ``run``) then pings its
targets the same way (:func:`check_targets`): a broker that does not answer within
:data:`CONNECT_TIMEOUT_S` ends it with one line naming the target and where it sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.contracts import Target
from periodic_manager.db.engine import create_engine, is_sqlite
from periodic_manager.db.migrate import database_revision, schema_problem
from periodic_manager.errors import PeriodicManagerError
from periodic_manager.runtime.causes import explain
from periodic_manager.settings import Settings
from periodic_manager.targets import registry
from periodic_manager.urls import redact_url

CONNECT_TIMEOUT_S = 10.0


class StartupError(PeriodicManagerError):
    """A dependency is unusable at start; the message is one line for an operator."""


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _missing_sqlite_file(url: str) -> bool:
    # SQLite would create a missing file on connect: better to say what is wrong.
    if not is_sqlite(url):
        return False
    path = make_url(url).database
    return path is not None and path not in ("", ":memory:") and not Path(path).exists()


async def check_database(
    url: str, *, must_exist: bool = True, engine: AsyncEngine | None = None
) -> str | None:
    """Connect once and read the schema revision; raise :class:`StartupError` unless the schema
    is at this version's head. ``must_exist=False`` (``migrate``) only checks the connection and
    returns the revision found (None: never migrated). ``engine``: the engine of ``url`` the
    process goes on with (its connection stays in the pool, ready for the first sync); without
    one, a throwaway engine."""
    where = f"database {redact_url(url)}"
    if must_exist and _missing_sqlite_file(url):
        raise StartupError(
            f"{where}: the file does not exist: run `periodic-manager migrate` "
            "(`periodic-manager run` creates it on SQLite)"
        )
    own = engine is None
    bind = create_engine(url, command_timeout=CONNECT_TIMEOUT_S) if engine is None else engine
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_S + 1), bind.connect() as conn:
            revision = await database_revision(conn)
    except Exception as exc:
        raise StartupError(f"{where}: {explain(exc, CONNECT_TIMEOUT_S)}") from exc
    finally:
        if own:
            await bind.dispose()
    if must_exist:
        problem = schema_problem(revision)
        if problem is not None:
            raise StartupError(f"{where}: {problem}")
    return revision


def check_probe_dir(settings: Settings) -> None:
    """With ``PM_PROBE_DIR`` set, the directory must be writable before any work starts."""
    if settings.probe_dir is None:
        return
    from periodic_manager.runtime.probe import ensure_writable

    try:
        ensure_writable(settings.probe_dir)
    except OSError as exc:
        raise StartupError(
            f"PM_PROBE_DIR: cannot write to {settings.probe_dir}: {exc.strerror or exc}"
        ) from None


def describe_targets(settings: Settings) -> str:
    """The configured targets with where each sends (passwords hidden), for the start-up log."""
    return ", ".join(describe_target(settings, name) for name in settings.configured_targets())


def describe_target(settings: Settings, name: str) -> str:
    """``name (where it sends)``, passwords hidden (a name no setting knows: the name alone)."""
    if name not in settings.configured_targets():
        return name
    return f"{name} ({registry.plugin(name).where(settings)})"


async def check_targets(settings: Settings, target: Target) -> None:
    """Ping every target of ``target`` (each of a routing target's) once, together, each within
    :data:`CONNECT_TIMEOUT_S`; raise :class:`StartupError` naming each one that does not answer
    (where it sends, password hidden) and the cause, in one line. A target that cannot be pinged
    counts as answering."""
    from periodic_manager.runtime.probe import ping_each
    from periodic_manager.runtime.target_health import targets_of

    failed = await ping_each(targets_of(target), CONNECT_TIMEOUT_S)
    failures = [
        f"target {describe_target(settings, name)}: {explain(exc, CONNECT_TIMEOUT_S)}"
        for name, exc in failed.items()
    ]
    if failures:
        raise StartupError("; ".join(failures))


async def check_configured_targets(settings: Settings) -> None:
    """:func:`check_targets` on targets built from ``settings`` for the check alone (``run``,
    before its API and manager start), closed after it."""
    from periodic_manager.runtime.assemble import build_target

    engine = create_engine(settings.database_url, command_timeout=CONNECT_TIMEOUT_S)
    try:
        try:
            target = build_target(settings, engine)
        except ValueError as exc:
            raise StartupError(str(exc)) from None
        try:
            await check_targets(settings, target)
        finally:
            with contextlib.suppress(Exception):
                await target.close()
    finally:
        await engine.dispose()
