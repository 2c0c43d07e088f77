"""The ``periodic-manager`` command.

Settings come from ``PM_*`` environment variables; flags override them, and each subcommand
accepts only the flags it uses. A bad setting prints one line and exits with status 2. A database
that cannot be used (unreachable, wrong password, missing, schema not at head), a target whose
broker does not answer (``manager``, ``run``), a port that cannot be bound or a probe directory
that cannot be written prints one line and exits with status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence
from typing import Any

from periodic_manager import __version__
from periodic_manager.cli.arguments import UsageError, add_commands, load_settings
from periodic_manager.settings import Settings

log = logging.getLogger("periodic_manager.cli.main")
PROG = "periodic-manager"
# Seconds between looks at a running manager's health beyond its loops dying (which is seen at
# once): its thresholds are a minute and more (HUNG_AFTER_S, SETTLED_STALL_S), so four looks a
# minute are enough: a manager at rest wakes no more often for them.
HEALTH_EVERY_S = 15.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Dynamic periodic-task manager: schedules are rows of a database."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_commands(parser.add_subparsers(dest="command", metavar="COMMAND"))
    return parser


def _fail(message: str, status: int) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    command: str | None = args.command
    if command is None:
        parser.print_help()
        return 2
    if command == "next":  # needs no settings and no database
        from periodic_manager.cli.files import print_next

        return print_next(args)
    if command == "health":
        return _health(args)
    try:
        settings = load_settings(args)
    except UsageError as exc:
        return _fail(str(exc), 2)
    from periodic_manager.cli.logs import configure
    from periodic_manager.runtime.startup import StartupError

    configure(settings.log_level, settings.log_format)
    try:
        if command == "migrate":
            return _migrate(settings)
        if command in ("import", "export"):
            from periodic_manager.cli.files import run_file_command

            return run_file_command(command, args, settings)  # checks the database itself
        if command == "backfill":
            from periodic_manager.cli.files import run_backfill

            return run_backfill(args, settings)
        if command == "dead-letters":
            from periodic_manager.cli.dead_letters import run

            return run(args, settings)
        if command == "keys":
            from periodic_manager.cli.keys import run_keys

            return run_keys(args, settings)
        if command == "manager":
            return asyncio.run(_run_manager(settings))
        return _serve(settings, role=command)
    except StartupError as exc:
        return _fail(str(exc), 1)
    except KeyboardInterrupt:
        return 130


def _health(args: argparse.Namespace) -> int:
    from periodic_manager.clock import SystemClock
    from periodic_manager.runtime.probe import check_probe

    directory = args.probe_dir or os.environ.get("PM_PROBE_DIR", "").strip()
    if not directory:
        return _fail("--probe-dir / PM_PROBE_DIR: not set (the directory the manager writes to)", 2)
    if args.max_age is not None and not args.max_age > 0:
        return _fail(f"--max-age: must be a positive number of seconds (got {args.max_age})", 2)
    verdict = check_probe(directory, args.role, SystemClock().now(), args.max_age)
    print(verdict.line, file=sys.stdout if verdict.ok else sys.stderr)
    return 0 if verdict.ok else 1


def _migrate(settings: Settings) -> int:
    from periodic_manager.db.migrate import head_revision, upgrade_sync
    from periodic_manager.runtime.causes import explain
    from periodic_manager.runtime.startup import CONNECT_TIMEOUT_S, StartupError, check_database
    from periodic_manager.urls import redact_url

    where = f"database {redact_url(settings.database_url)}"
    asyncio.run(check_database(settings.database_url, must_exist=False))  # reachable at all?
    try:
        applied = upgrade_sync(settings.database_url)
    except Exception as exc:
        log.debug("migration failed", exc_info=exc)
        raise StartupError(f"{where}: migration failed: {explain(exc, CONNECT_TIMEOUT_S)}") from exc
    for step in applied:
        log.info("applied %s", step)
    if applied:
        log.info("%s: schema at head %s (%d applied)", where, head_revision(), len(applied))
    else:
        log.info("%s: schema already at head %s, nothing to apply", where, head_revision())
    return 0


def _log_start(role: str, settings: Settings, revision: str | None, extra: str = "") -> None:
    from periodic_manager.runtime.startup import describe_targets
    from periodic_manager.urls import redact_url

    targets = describe_targets(settings)
    log.info(
        "periodic-manager %s %s: database %s (schema %s), target %s%s",
        __version__,
        role,
        redact_url(settings.database_url),
        revision,
        targets,
        extra,
    )


async def _run_manager(settings: Settings) -> int:
    from periodic_manager import gcpolicy
    from periodic_manager.clock import SystemClock
    from periodic_manager.db.engine import create_engine
    from periodic_manager.runtime.assemble import build_manager
    from periodic_manager.runtime.probe import ProbeWriter, manager_health
    from periodic_manager.runtime.startup import (
        StartupError,
        check_database,
        check_probe_dir,
        check_targets,
    )

    check_probe_dir(settings)
    # One engine: the schema check's connection is the first sync's. No pre-ping: at rest it
    # was most of the heartbeat's round trips, and every loop of the manager retries anyway.
    engine = create_engine(settings.database_url, ping=False)
    try:
        revision = await check_database(settings.database_url, engine=engine)
        gcpolicy.enable()  # this process exists to hold the schedule: collect around its work
        manager = build_manager(settings, engine)
    except ValueError as exc:
        await engine.dispose()
        raise StartupError(str(exc)) from None
    except BaseException:
        await engine.dispose()
        raise
    try:
        await check_targets(settings, manager.target)  # a broker that does not answer: one line
    except BaseException:
        with contextlib.suppress(Exception):
            await manager.target.close()
        await engine.dispose()
        raise
    metrics_server = None
    try:
        metrics_server = _start_metrics(settings, manager)
        metrics = (
            f", metrics on http://{settings.metrics_host}:{settings.metrics_port}/metrics"
            if metrics_server is not None
            else ""
        )
        _log_start("manager", settings, revision, metrics)
        probe = None
        if settings.probe_dir is not None:
            probe = ProbeWriter(
                settings.probe_dir,
                "manager",
                manager_health(manager),
                clock=SystemClock(),
                interval_s=settings.probe_interval,
            )
        return await _supervise(manager, probe)
    finally:
        await engine.dispose()
        if metrics_server is not None:
            metrics_server.shutdown()


def _start_metrics(settings: Settings, manager: Any) -> Any:
    if settings.metrics_port is None:
        return None
    from prometheus_client import start_http_server

    from periodic_manager.runtime.startup import StartupError, is_loopback

    try:
        server, _ = start_http_server(
            settings.metrics_port, addr=settings.metrics_host, registry=manager.metrics.registry
        )
    except OSError as exc:
        where = f"{settings.metrics_host}:{settings.metrics_port}"
        raise StartupError(
            f"PM_METRICS_PORT: cannot listen on {where}: {exc.strerror or exc}"
        ) from None
    if not is_loopback(settings.metrics_host):
        log.warning(
            "metrics on %s:%s have no authentication: anyone who reaches the port reads them",
            settings.metrics_host,
            settings.metrics_port,
        )
    return server


async def _supervise(manager: Any, probe: Any) -> int:
    """Start ``manager``, keep its probe file fresh, stop on SIGINT/SIGTERM or when a loop died."""
    from periodic_manager.clock import next_tick, sleep_unless
    from periodic_manager.runtime.startup import StartupError

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    probe_task = None
    reason: str | None = None
    try:
        await manager.start()
        from periodic_manager import gcpolicy

        gcpolicy.settle()  # what start-up left behind is freed once, the rest never walked again
        if probe is not None:
            try:
                probe.write()  # a directory that cannot be written is a start-up error
            except OSError as exc:
                raise StartupError(f"PM_PROBE_DIR: cannot write {probe.path}: {exc}") from None
            probe_task = asyncio.create_task(probe.run(), name="periodic-manager-probe")
        while not stop.is_set() and (reason := manager.health()) is None:
            # A loop that dies wakes this at once; what only time shows (a dispatch hung for
            # minutes, a takeover stalled for a minute) is looked at every HEALTH_EVERY_S.
            await sleep_unless(
                manager.clock,
                stop,
                manager.tasks.died,
                until=next_tick(manager.clock.now(), HEALTH_EVERY_S),
            )
    finally:
        if probe_task is not None:
            probe_task.cancel()
            await asyncio.gather(probe_task, return_exceptions=True)
        if probe is not None:
            probe.remove()
        await manager.stop()
    if reason is not None:
        # A loop died or dispatch hangs: say why in one line, last, and exit non-zero, so a
        # supervisor restarts us instead of trusting a process that no longer schedules.
        print(f"periodic-manager: error: {reason}", file=sys.stderr, flush=True)
        return 1
    return 0


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``, bound before anything else starts, so a port in
    use ends the command before a manager leads or a migration runs."""
    from periodic_manager.runtime.startup import StartupError

    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise StartupError(f"--host / PM_HOST: cannot resolve {host!r}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    try:
        # As uvicorn does: a restart may reuse the port while old connections are in TIME_WAIT
        # (on Linux this never lets two servers listen on one port).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def _serve(settings: Settings, *, role: str) -> int:
    from periodic_manager.api.auth import exposure
    from periodic_manager.db.engine import is_sqlite
    from periodic_manager.runtime.startup import StartupError, check_database

    if (why := exposure(settings)) is not None:
        from periodic_manager.cli.keys import admin_key_exists

        # Beyond loopback with no token: an active admin key in the database is enough (keys
        # turn auth on). Only asked then, so a start with a token opens no connection early.
        if not asyncio.run(admin_key_exists(settings)):
            raise StartupError(why)
    if role == "run":
        from periodic_manager.runtime.assemble import build_leadership
        from periodic_manager.runtime.startup import check_probe_dir

        check_probe_dir(settings)
        try:
            build_leadership(settings)  # a setting the manager cannot use fails before the bind
        except ValueError as exc:
            raise StartupError(str(exc)) from None

    sock = bind_socket(settings.host, settings.port)
    try:
        if role == "run" and is_sqlite(settings.database_url):
            _migrate(settings)  # the embedded default needs no separate step
        revision = asyncio.run(check_database(settings.database_url))
        if role == "run":
            from periodic_manager.runtime.startup import check_configured_targets

            asyncio.run(check_configured_targets(settings))  # a broker that does not answer
        import uvicorn  # after the checks: a failing start stays quick

        from periodic_manager.api.app import create_app
        from periodic_manager.runtime.assemble import build_manager

        port = sock.getsockname()[1]
        _log_start(role, settings, revision, f", API on http://{settings.host}:{port}")
        with_manager = role == "run"
        if with_manager:
            from periodic_manager import gcpolicy

            gcpolicy.enable()
        tracing = None
        if settings.otel:  # one exporter for the API's spans and the manager's
            from periodic_manager.runtime.startup import StartupError
            from periodic_manager.tracing import start_tracing

            try:
                tracing = start_tracing()
            except ValueError as exc:  # a wrong OTEL_* variable, or the extra missing
                raise StartupError(str(exc)) from None
        factory = (
            (lambda engine: build_manager(settings, engine, tracing=tracing))
            if with_manager
            else None
        )
        app = create_app(settings, manager_factory=factory, tracing=tracing)
        # JSON logs: uvicorn's loggers propagate to the root handler instead of using its own format.
        extra: dict[str, Any] = {"log_config": None} if settings.log_format == "json" else {}
        config = uvicorn.Config(
            app, host=settings.host, port=port, log_level=settings.log_level.lower(), **extra
        )
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
