"""CLI commands that need no server: ``next`` (preview a spec), ``import``, ``export`` and
``backfill``.

Each failure is one line on stderr: status 2 for bad input (a spec, a file, an entry), 1 when the
database cannot be used.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from periodic_manager.clock import SystemClock
from periodic_manager.contracts import Clock
from periodic_manager.errors import ConfigError
from periodic_manager.schedules import bounds as slot_bounds
from periodic_manager.schedules import runs as slot_runs
from periodic_manager.schedules.calendars import CalendarSpec, Exclusion, check_spec, exclusion
from periodic_manager.schedules.instants import slot_text
from periodic_manager.schedules.judge import parse_schedule
from periodic_manager.schedules.rules import checked_options
from periodic_manager.schedules.slots import Rule
from periodic_manager.settings import Settings

PROG = "periodic-manager"


def _fail(message: str, status: int = 2) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return status


def _exclusion(args: argparse.Namespace) -> Exclusion | None:
    """The calendars ``--exclude-dates`` and ``--exclude-holidays`` describe, judged as the API
    judges a calendar (ConfigError naming the flag); None without them."""
    found: dict[str, CalendarSpec] = {}
    for flag, value in (
        ("--exclude-dates", args.exclude_dates),
        ("--exclude-holidays", args.exclude_holidays),
    ):
        if value is None:
            continue
        if flag == "--exclude-dates":
            doc: Any = {"dates": [d.strip() for d in value.split(",") if d.strip()]}
        else:
            country, _, subdiv = value.partition("-")
            doc = {"holidays": {"country": country, **({"subdiv": subdiv} if subdiv else {})}}
        try:
            found[flag] = check_spec(doc)
        except ConfigError as exc:
            raise ConfigError(flag, f"{exc.field}: {exc.reason}") from None
    return exclusion(list(found), found) if found else None


def print_next(args: argparse.Namespace) -> int:
    """``next SPEC [--tz ZONE] [-n N] [--start-at T] [--end-at T] [--max-runs N]
    [--exclude-dates D,..] [--exclude-holidays CC-SUB]``: one line per slot, ``<UTC>  <local
    with offset> <abbr>``; within options.start_at/end_at, without excluded dates and at most
    options.max_runs slots, as the engine sends (a new schedule: no run counted yet)."""
    from periodic_manager.schedules.describe import describe

    if not 1 <= args.n <= 10_000:
        return _fail(f"-n: must be between 1 and 10000 (got {args.n})")
    anchor = None
    if args.anchor is not None:
        try:
            anchor = datetime.fromisoformat(args.anchor.replace("Z", "+00:00"))
        except ValueError:
            return _fail(f"--anchor: not an ISO 8601 instant: {args.anchor!r}")
    try:
        schedule = parse_schedule(args.spec, args.tz, anchor)
    except ConfigError as exc:
        where = {"timezone": "--tz", "anchor": "--anchor"}.get(exc.field, exc.field)
        return _fail(f"{where}: {exc.reason}")
    window = {
        key: value
        for key, value in (("start_at", args.start_at), ("end_at", args.end_at))
        if value is not None
    }
    if args.max_runs is not None:
        try:
            window["max_runs"] = int(args.max_runs)
        except ValueError:
            return _fail(f"--max-runs: must be an integer from 1 to {slot_runs.MAX_RUNS}")
    try:  # the option checks of the row, so the CLI accepts what a schedule may hold
        options, _ = checked_options(window, slot_bounds.MAX_TEXT * 4)
    except ConfigError as exc:
        where = exc.field.replace("options.", "--").replace("_", "-")
        return _fail(f"{where}: {exc.reason}")
    try:
        excluded = _exclusion(args)
    except ConfigError as exc:
        return _fail(f"{exc.field}: {exc.reason}")
    zone = ZoneInfo(args.tz)
    if args.describe:
        print(f"# {describe(args.spec) or '(no description for this expression)'}")
    now = SystemClock().now()
    rule = Rule(schedule, slot_bounds.bounds_of(options), excluded, args.tz)
    for slot, _ in rule.upcoming(now, args.n, left=slot_runs.max_runs_of(options)):
        local = slot.astimezone(zone)
        print(f"{slot_text(slot)}  {local.isoformat()} {local.tzname()}")
    return 0


def _on_database(settings: Settings, work: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """Run ``work`` once the database answers; one line and status 1 when it cannot be used
    (unreachable, never migrated, a driver error)."""
    from sqlalchemy.exc import SQLAlchemyError

    from periodic_manager.runtime.startup import StartupError, check_database

    try:
        asyncio.run(check_database(settings.database_url))
        return asyncio.run(work())
    except StartupError as exc:
        return _fail(str(exc), 1)
    except (SQLAlchemyError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return _fail(f"database: {first}", 1)


def run_file_command(command: str, args: argparse.Namespace, settings: Settings) -> int:
    from periodic_manager.db.engine import url_backend
    from periodic_manager.schedules import files as sio
    from periodic_manager.schedules.files import FileError

    try:
        if command != "import":
            return _on_database(settings, lambda: _export(args, settings))
        source = "stdin" if args.file == "-" else args.file
        fmt = sio.format_of(args.file, args.format) if args.file != "-" else (args.format or "json")
        try:
            if args.file == "-":
                text = sys.stdin.read()
            else:
                with open(args.file, encoding="utf-8") as fh:
                    text = fh.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise FileError(f"{source}: {exc}") from None
        entries, raw_calendars = sio.parse_document(text, fmt, source)
        calendars = sio.validate_calendars(raw_calendars, source)
        desired = sio.validate(
            entries,
            source,
            settings.max_payload_bytes,
            targets=settings.configured_targets(),
            database=url_backend(settings.database_url),
        )
        # The file first (exit 2), then the database (exit 1): unreachable, never migrated...
        return _on_database(settings, lambda: _import(desired, calendars, source, args, settings))
    except FileError as exc:
        return _fail(str(exc))


async def _import(
    desired: list[dict[str, Any]],
    calendars: dict[str, Any],
    source: str,
    args: argparse.Namespace,
    settings: Settings,
) -> int:
    from periodic_manager.db.engine import create_engine
    from periodic_manager.schedules import import_export
    from periodic_manager.schedules.files import check_excludes

    engine = create_engine(settings.database_url)
    try:
        # Every calendar an entry's options.exclude names: in the file, or already stored.
        known = {*calendars, *await import_export.stored_calendars(engine)}
        check_excludes(desired, known, source)
        plan = await import_export.plan(
            engine, desired, args.prune, settings.max_payload_bytes, calendars
        )
        for line in import_export.render(plan):
            print(line)
        if args.dry_run:
            print("dry run: nothing written")
        elif not plan.empty:
            await import_export.apply(engine, plan, SystemClock().now())
    finally:
        await engine.dispose()
    return 0


async def _export(args: argparse.Namespace, settings: Settings) -> int:
    from periodic_manager.db.engine import create_engine
    from periodic_manager.schedules import files as sio
    from periodic_manager.schedules import import_export

    engine = create_engine(settings.database_url)
    try:
        export = await import_export.export_entries(
            engine,
            settings.max_payload_bytes,
            settings.configured_targets(),
            nulls_as_stored=args.format == "toml",
        )
    finally:
        await engine.dispose()
    sys.stdout.write(sio.dump(export.entries, args.format, export.calendars))
    for line in export.invalid:
        # Not a failure: the file restores them as they are. Said, so nobody is surprised.
        print(f"{PROG}: note: exported as stored (invalid): {line}", file=sys.stderr)
    return 0


def run_backfill(args: argparse.Namespace, settings: Settings) -> int:
    """``backfill NAME --from T --to T [--dry-run] [--force]``: every slot of the schedule in
    [from, to) never sent, sent once through the configured target, paced (``PM_CATCHUP_RATE``);
    prints the counts. Bad input: one line, status 2; a paused or unusable schedule: status 2;
    the database unusable: status 1; slots older than what is remembered left unsent (no
    ``--force``): a note on stderr, status 3."""
    try:
        return _on_database(settings, lambda: backfill_command(args, settings))
    except ConfigError as exc:
        return _fail(f"--{exc.field.replace('_', '-')}: {exc.reason}")


async def backfill_command(
    args: argparse.Namespace, settings: Settings, clock: Clock | None = None
) -> int:
    """The backfill command's work (``clock``: the system's unless given, as by tests)."""
    from periodic_manager import backfill
    from periodic_manager.db import calendars, judge, schedule_reader, view
    from periodic_manager.db.engine import create_engine, reads_bytes
    from periodic_manager.runtime.assemble import build_target

    clock = clock or SystemClock()
    start, end = backfill.parse_range(args.from_, args.to, clock.now())
    engine = create_engine(settings.database_url)
    target = None
    try:
        async with engine.connect() as conn:
            raw = await schedule_reader.row_named(conn, args.name)
            known_calendars = await calendars.specs(conn)
        if raw is None:
            return _fail(f"NAME: no schedule named {args.name!r}")
        rules = judge.rules_for(
            reads_bytes(engine), settings.max_payload_bytes, settings.configured_targets()
        ).with_calendars(known_calendars)  # options.exclude: judged as the manager judges it
        row = view.view(rules, raw)
        if row.config is None or not row.usable:
            field, reason = row.errors[0]
            return _fail(f"the stored schedule is unusable: {field}: {reason}")
        if row.enabled is False:
            return _fail(f"{args.name}: the schedule is paused: resume it before a backfill")
        found = backfill.slots_in(row.config, start, end)
        target = build_target(settings, engine)
        created = row.values.get("created_at")
        outcome = await backfill.backfill(
            engine,
            row.config,
            target,
            clock,
            found,
            backfill.Policy.of(settings, dry_run=args.dry_run, force=bool(args.force)),
            created_at=created if isinstance(created, datetime) and created.tzinfo else None,
        )
    finally:
        if target is not None:
            await target.close()
        await engine.dispose()
    return _report(outcome)


def _report(outcome: Any) -> int:
    more = f", {outcome.excluded} excluded" if outcome.excluded else ""
    if outcome.over_limit:
        more += f", {outcome.over_limit} over options.max_runs"
    if outcome.dry_run:
        print(
            f"dry run: {outcome.slots} slot(s) in the range, {outcome.already_sent} already sent, "
            f"{outcome.to_send} would be sent{more} (the target's claims are not asked in a dry run)"
        )
    else:
        print(
            f"{outcome.slots} slot(s) in the range: {outcome.sent} sent, {outcome.already_sent} "
            f"already sent, {outcome.skipped} skipped (overlap), {outcome.failed} failed{more}"
        )
    if outcome.unchecked and not outcome.forced:
        print(
            f"{PROG}: note: {outcome.unchecked} slot(s) older than what is remembered "
            "(PM_RUNS_RETENTION, PM_RUNS_MAX_PER_SCHEDULE) cannot be checked and were not sent: "
            "--force sends them",
            file=sys.stderr,
        )
    elif outcome.unchecked:
        print(
            f"{PROG}: note: {outcome.unchecked} slot(s) that could not be checked were sent (--force)",
            file=sys.stderr,
        )
    if outcome.failed:
        return 1
    return 3 if outcome.unchecked and not outcome.forced and not outcome.dry_run else 0
