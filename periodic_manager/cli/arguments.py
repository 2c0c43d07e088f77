"""The arguments of the ``periodic-manager`` command: each subcommand's flags (a flag overrides its
``PM_*`` setting, and a subcommand accepts only the flags it uses) and the arguments of its own.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from pydantic import ValidationError

from periodic_manager.cli import dead_letters
from periodic_manager.settings import Settings

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

FLAGS: dict[str, tuple[str, str]] = {
    # flag -> (settings field, help)
    "--database-url": ("database_url", "database URL (PM_DATABASE_URL)"),
    "--redis-url": ("redis_url", "Redis URL (PM_REDIS_URL)"),
    "--target": ("target", "default target: the name of an installed target (PM_TARGET)"),
    "--sync-interval": ("sync_interval", "seconds between syncs (PM_SYNC_INTERVAL)"),
    "--grace": ("grace", "seconds a slot may be late (PM_GRACE)"),
    "--host": ("host", "API bind address (PM_HOST)"),
    "--port": ("port", "API port (PM_PORT)"),
    "--log-level": ("log_level", "DEBUG, INFO, WARNING, ERROR (PM_LOG_LEVEL)"),
    "--log-format": ("log_format", "text or json (PM_LOG_FORMAT)"),
}
_DB = ("--database-url",)
_LOG = ("--log-level", "--log-format")
_TARGET = ("--redis-url", "--target")
# subcommand -> (one-line description, the flags it uses)
COMMANDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "run": (
        "serve the API and run a manager in one process (on SQLite it migrates by itself)",
        (*_DB, *_TARGET, "--sync-interval", "--grace", "--host", "--port", *_LOG),
    ),
    "manager": (
        "run a manager alone: read the schedules and enqueue every due slot",
        (*_DB, *_TARGET, "--sync-interval", "--grace", *_LOG),
    ),
    "api": (
        "serve the API alone (edits schedules; shows what running managers hold)",
        (*_DB, *_TARGET, "--grace", "--host", "--port", *_LOG),
    ),
    "migrate": ("upgrade the database schema to this version's head", (*_DB, *_LOG)),
    "import": ("upsert schedules from a JSON, YAML or TOML file by name", (*_DB, *_LOG)),
    "export": ("print every schedule as a JSON, YAML or TOML file", (*_DB, *_LOG)),
    "keys": ("create, list and revoke API keys (each with a scope)", (*_DB, *_LOG)),
    "backfill": (
        "send every slot of a schedule in [--from, --to) that was never sent, once, paced",
        (*_DB, *_TARGET, "--grace", *_LOG),
    ),
    "dead-letters": (
        "list, replay or purge the http target's dead letters",
        (*_DB, *_LOG),
    ),
}


class UsageError(Exception):
    """A bad setting or argument: printed as one line, exit status 2."""


def add_commands(sub: Subparsers) -> None:
    """Add every subcommand to ``sub``: those of :data:`COMMANDS` with their flags, then
    ``next`` and ``health``, which read no settings."""
    subs: dict[str, argparse.ArgumentParser] = {}
    for name, (description, flags) in COMMANDS.items():
        subs[name] = sub.add_parser(name, help=description, description=description)
        for flag in flags:
            field, help_text = FLAGS[flag]
            subs[name].add_argument(flag, dest=field, default=None, help=help_text)
    _add_next(sub)
    _add_files(subs["import"], subs["export"])
    _add_backfill(subs["backfill"])
    dead_letters.add_arguments(subs["dead-letters"])
    _add_keys(subs["keys"])
    _add_health(sub)


def _add_next(sub: Subparsers) -> None:
    """``next``: a spec's next slots, with the options that bound or thin them."""
    nxt = sub.add_parser(
        "next",
        help="print the next slots of a spec (no database needed)",
        description="print the next slots of a spec, in UTC and local time (no database needed)",
    )
    nxt.add_argument("spec", help='cron expression, macro or "@every 90s"')
    nxt.add_argument("--tz", default="UTC", help="IANA zone (default UTC)")
    nxt.add_argument("-n", type=int, default=5, help="how many slots (default 5)")
    nxt.add_argument("--anchor", default=None, help="phase of @every (ISO 8601 with offset)")
    nxt.add_argument(
        "--start-at",
        default=None,
        help="options.start_at: no slot before it (ISO 8601 with offset)",
    )
    nxt.add_argument(
        "--end-at",
        default=None,
        help="options.end_at: no slot at or after it (ISO 8601 with offset)",
    )
    nxt.add_argument(
        "--exclude-dates",
        default=None,
        metavar="D1,D2",
        help="as options.exclude naming a calendar of these dates (YYYY-MM-DD): no slot on them",
    )
    nxt.add_argument(
        "--exclude-holidays",
        default=None,
        metavar="CC[-SUBDIV]",
        help="as options.exclude naming the public holidays of a country (DE, DE-BY)",
    )
    nxt.add_argument(
        "--max-runs", default=None, help="options.max_runs: at most this many slots (1 to 10^9)"
    )
    nxt.add_argument("--describe", action="store_true", help="first print a description")


def _add_files(imp: argparse.ArgumentParser, export: argparse.ArgumentParser) -> None:
    """``import`` and ``export``: the schedule file and its format."""
    imp.add_argument("file", help="JSON, YAML or TOML list of schedules ('-' reads stdin)")
    imp.add_argument("--format", choices=("json", "yaml", "toml"), default=None)
    imp.add_argument("--dry-run", action="store_true", help="print the changes, write nothing")
    imp.add_argument("--prune", action="store_true", help="delete schedules not in the file")
    export.add_argument("--format", choices=("json", "yaml", "toml"), default="json")


def _add_backfill(bf: argparse.ArgumentParser) -> None:
    """``backfill``: the schedule and the range of its slots."""
    bf.add_argument("name", help="the schedule's name")
    bf.add_argument(
        "--from", dest="from_", required=True, help="first instant (ISO 8601 with offset)"
    )
    bf.add_argument(
        "--to", required=True, help="end, excluded, not after now (ISO 8601 with offset)"
    )
    bf.add_argument("--dry-run", action="store_true", help="count only: send and record nothing")
    bf.add_argument(
        "--force",
        action="store_true",
        help="also send the slots older than what is remembered (PM_RUNS_RETENTION, "
        "PM_RUNS_MAX_PER_SCHEDULE), which may have been sent already",
    )


def _add_keys(keys: argparse.ArgumentParser) -> None:
    """``keys create|list|revoke``: API keys (periodic_manager/access.py)."""
    what = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    create = what.add_parser(
        "create",
        help="make a key; prints it alone on the last line (shown once: only its hash is kept)",
    )
    create.add_argument("--name", required=True, help="the key's name (unique; 1-64 characters)")
    create.add_argument(
        "--scope",
        required=True,
        help="read < trigger (trigger, backfill, pause, resume) < write < admin (keys, calendars)",
    )
    create.add_argument(
        "--expires-at", default=None, help="when it stops working (ISO 8601 with offset)"
    )
    what.add_parser("list", help="every key: name, scope, state, expiry, last use (no secret)")
    revoke = what.add_parser("revoke", help="revoke a key: refused from the next request")
    revoke.add_argument("name", help="the key's name")


def _add_health(sub: Subparsers) -> None:
    """``health``: where the probe file is and how old it may be."""
    health = sub.add_parser(
        "health",
        help="liveness of a manager: exit 1 if its probe file is stale or missing",
        description="read <PM_PROBE_DIR>/<role>.json; exit 0 if fresh and healthy, 1 if it is "
        "missing, unreadable, stale, written in the future (clock skew) or unhealthy",
    )
    health.add_argument("--role", choices=("manager", "run"), default="manager")
    health.add_argument(
        "--probe-dir", default=None, help="directory of the probe file (PM_PROBE_DIR)"
    )
    health.add_argument(
        "--max-age",
        type=float,
        default=None,
        metavar="S",
        help="seconds after which the probe is stale (default: 3 write intervals, at least 30)",
    )


def load_settings(args: argparse.Namespace) -> Settings:
    """The settings of the ``PM_*`` variables, each flag given overriding its own; a bad one is a
    :class:`UsageError` naming the flag and the variable."""
    overrides = {
        field: getattr(args, field)
        for field, _ in FLAGS.values()
        if getattr(args, field, None) is not None
    }
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else "settings"
        flag = next((f for f, (name, _) in FLAGS.items() if name == field), None)
        where = f"{flag} / PM_{field.upper()}" if flag else f"PM_{field.upper()}"
        got = err.get("input")
        if isinstance(got, str) and field.endswith("_url"):
            from periodic_manager.urls import redact_url

            got = redact_url(got)  # a rejected URL may still carry a real password
        raise UsageError(f"{where}: {err['msg']} (got {got!r})") from None
