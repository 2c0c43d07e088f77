"""The ``periodic-manager`` command: run (API + manager), manager, api, migrate, next, import,
export.

Settings come from ``PM_*`` environment variables; flags override them. A bad setting prints one
readable line and exits with status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from periodic_manager import __version__
from periodic_manager.settings import Settings

log = logging.getLogger("periodic_manager.cli")

FLAGS: dict[str, tuple[str, str]] = {
    # flag -> (settings field, help)
    "--database-url": ("database_url", "database URL (PM_DATABASE_URL)"),
    "--redis-url": ("redis_url", "Redis URL (PM_REDIS_URL)"),
    "--target": ("target", "default target: redis, outbox, celery or arq (PM_TARGET)"),
    "--sync-interval": ("sync_interval", "seconds between syncs (PM_SYNC_INTERVAL)"),
    "--grace": ("grace", "seconds a slot may be late (PM_GRACE)"),
    "--host": ("host", "API bind address (PM_HOST)"),
    "--port": ("port", "API port (PM_PORT)"),
    "--log-level": ("log_level", "DEBUG, INFO, WARNING, ERROR (PM_LOG_LEVEL)"),
    "--log-format": ("log_format", "text or json (PM_LOG_FORMAT)"),
}


class UsageError(Exception):
    """A bad setting or argument: printed as one line, exit status 2."""


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    for flag, (_, help_text) in FLAGS.items():
        common.add_argument(flag, dest=FLAGS[flag][0], default=None, help=help_text)
    parser = argparse.ArgumentParser(
        prog="periodic-manager", description="Dynamic periodic-task manager backed by a database."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", parents=[common], help="API and manager in one process (embedded defaults)")
    sub.add_parser("manager", parents=[common], help="the manager alone")
    sub.add_parser("api", parents=[common], help="the API alone")
    sub.add_parser("migrate", parents=[common], help="upgrade the database schema to head")
    nxt = sub.add_parser("next", help="print the next slots of a spec (UTC and local)")
    nxt.add_argument("spec", help='cron expression, macro or "@every 90s"')
    nxt.add_argument("--tz", default="UTC", help="IANA zone (default UTC)")
    nxt.add_argument("-n", type=int, default=5, help="how many slots (default 5)")
    nxt.add_argument("--anchor", default=None, help="phase of @every (ISO 8601 with offset)")
    nxt.add_argument("--describe", action="store_true", help="first print a description")
    imp = sub.add_parser("import", parents=[common], help="upsert schedules from a file by name")
    imp.add_argument("file", help="JSON, YAML or TOML list of schedules ('-' reads stdin)")
    imp.add_argument("--format", choices=("json", "yaml", "toml"), default=None)
    imp.add_argument("--dry-run", action="store_true", help="print the changes, write nothing")
    imp.add_argument("--prune", action="store_true", help="delete schedules not in the file")
    exp = sub.add_parser("export", parents=[common], help="print every schedule as a file")
    exp.add_argument("--format", choices=("json", "yaml", "toml"), default="json")
    return parser


def load_settings(args: argparse.Namespace) -> Settings:
    overrides = {field: getattr(args, field) for field, _ in FLAGS.values() if getattr(args, field, None) is not None}
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else "settings"
        flag = next((f for f, (name, _) in FLAGS.items() if name == field), None)
        where = f"{flag} / PM_{field.upper()}" if flag else f"PM_{field.upper()}"
        raise UsageError(f"{where}: {err['msg']} (got {err.get('input')!r})") from None


def _configure_logging(level: str, fmt: str = "text") -> None:
    from periodic_manager.logs import configure

    configure(level, fmt)


def _migrate(settings: Settings) -> None:
    from periodic_manager.db.migrate import upgrade_sync

    upgrade_sync(settings.database_url)


def _serve(settings: Settings, *, with_manager: bool) -> None:
    import uvicorn

    from api.app import create_app
    from periodic_manager.service import build_manager

    factory = (lambda engine: build_manager(settings, engine)) if with_manager else None
    app = create_app(settings, manager_factory=factory)
    # JSON logs: uvicorn's loggers propagate to the root handler instead of using its own format.
    extra: dict[str, Any] = {"log_config": None} if settings.log_format == "json" else {}
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level=settings.log_level.lower(), **extra
    )
    uvicorn.Server(config).run()


async def _run_manager(settings: Settings) -> int:
    from periodic_manager.db.engine import create_engine
    from periodic_manager.service import build_manager

    engine = create_engine(settings.database_url)
    manager = build_manager(settings, engine)
    metrics_server = None
    if settings.metrics_port is not None:
        from prometheus_client import start_http_server

        metrics_server, _ = start_http_server(
            settings.metrics_port, addr=settings.host, registry=manager.metrics.registry
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await manager.start()
        while not stop.is_set() and manager.failed is None:
            try:
                await asyncio.wait_for(stop.wait(), timeout=1.0)
            except TimeoutError:
                pass
    finally:
        await manager.stop()
        await engine.dispose()
        if metrics_server is not None:
            metrics_server.shutdown()
    return 1 if manager.failed is not None else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    command: str = args.command
    try:
        if command == "next":  # needs no settings and no database
            from periodic_manager.cli_files import print_next

            return print_next(args)
        settings = load_settings(args)
    except UsageError as exc:
        print(f"periodic-manager: error: {exc}", file=sys.stderr)
        return 2
    _configure_logging(settings.log_level, settings.log_format)
    try:
        if command in ("import", "export"):
            from periodic_manager.cli_files import run_file_command

            return run_file_command(command, args, settings)
        if command == "migrate":
            _migrate(settings)
            log.info("database at head")
            return 0
        from periodic_manager.db.engine import is_sqlite

        if command == "run" and is_sqlite(settings.database_url):
            _migrate(settings)  # the embedded default needs no separate step
        if command == "manager":
            return asyncio.run(_run_manager(settings))
        _serve(settings, with_manager=command == "run")
        return 0
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        print(f"periodic-manager: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
