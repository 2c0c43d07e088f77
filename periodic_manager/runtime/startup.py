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
import socket
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine

from periodic_manager.contracts import Target
from periodic_manager.db.engine import create_engine, is_sqlite
from periodic_manager.db.migrate import database_revision, schema_problem
from periodic_manager.errors import PeriodicManagerError
from periodic_manager.settings import Settings

CONNECT_TIMEOUT_S = 10.0


class StartupError(PeriodicManagerError):
    """A dependency is unusable at start; the message is one line for an operator."""


def redact_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (any scheme: database, Redis, AMQP)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        pass
    parts = urlsplit(url)
    if parts.password is None:
        return url
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hostinfo}"))


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _root_cause(exc: BaseException) -> BaseException:
    """The most specific error behind SQLAlchemy's and the drivers' wrappers. A TimeoutError is
    a cause of its own: what it wraps (the CancelledError of ``asyncio.timeout``) says less. A
    socket error a client raised its own error while handling (redis-py's ConnectionError) is
    the cause too."""
    seen: set[int] = set()
    while id(exc) not in seen and not isinstance(exc, TimeoutError):
        seen.add(id(exc))
        context = exc.__context__ if isinstance(exc.__context__, OSError) else None
        inner = getattr(exc, "orig", None) or exc.__cause__ or context
        if not isinstance(inner, BaseException):
            break
        exc = inner
    return exc


def explain(exc: BaseException) -> str:
    """One line saying why a connection or statement failed, without the driver's noise."""
    cause = _root_cause(exc)
    if isinstance(cause, TimeoutError):
        return f"no answer within {CONNECT_TIMEOUT_S:.0f} s"
    if isinstance(cause, socket.gaierror):
        return f"cannot resolve the host ({cause.strerror or cause})"
    if isinstance(cause, ConnectionRefusedError):
        return "connection refused (is the server running, on this host and port?)"
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror[0].lower() + cause.strerror[1:]
    text = str(cause).strip()
    first = text.splitlines()[0] if text else type(cause).__name__
    return first


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
        raise StartupError(f"{where}: {explain(exc)}") from exc
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
    return f"{name} ({_where(settings, name)})"


def _where(settings: Settings, name: str) -> str:
    if name == "redis":
        # Whether overlap skip/hold can work depends on the workers' consumer group.
        group = settings.redis_group
        return redact_url(settings.redis_url) + (
            f", consumer group {group}" if group else ", no consumer group"
        )
    if name == "celery":
        # The broker it publishes to (PM_CELERY_APP's own when that sets one), where the
        # claims live when that broker is not Redis, and the result backend.
        from periodic_manager.targets.celery.app import REDIS_SCHEMES

        broker = settings.celery_broker()
        where = redact_url(broker)
        if not broker.startswith(REDIS_SCHEMES):
            where += f", claims {redact_url(settings.redis_url)}"
        backend = settings.celery_backend()
        return where + (f", results {redact_url(backend)}" if backend else "")
    if name == "arq":
        return redact_url(settings.arq_redis_url or settings.redis_url)
    if name == "rq":
        return redact_url(settings.rq_redis_url or settings.redis_url)
    if name == "dramatiq":
        # The broker, and where the claims live when that broker is RabbitMQ.
        from periodic_manager.targets.dramatiq import AMQP_SCHEMES

        broker = settings.dramatiq_broker()
        where = redact_url(broker)
        if broker.startswith(AMQP_SCHEMES):
            return where + f", claims {redact_url(settings.redis_url)}"
        return where + f", namespace {settings.dramatiq_namespace}"
    if name == "procrastinate":
        return f"procrastinate_jobs in {redact_url(settings.database_url)}"
    return "table pm_outbox"


async def check_targets(settings: Settings, target: Target) -> None:
    """Ping every target of ``target`` (each of a routing target's) once, together, each within
    :data:`CONNECT_TIMEOUT_S`; raise :class:`StartupError` naming each one that does not answer
    (where it sends, password hidden) and the cause, in one line. A target that cannot be pinged
    counts as answering."""
    from periodic_manager.runtime.probe import ping_each
    from periodic_manager.runtime.target_health import targets_of

    failed = await ping_each(targets_of(target), CONNECT_TIMEOUT_S)
    failures = [
        f"target {describe_target(settings, name)}: {explain(exc)}" for name, exc in failed.items()
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
