"""``periodic-manager dead-letters list|replay|purge``: the http target's dead letters (the API's
``/dead-letters``, from a shell). ``replay`` and ``purge`` take ids, ``--schedule NAME`` or
``--all``; a replay sends again with the same Idempotency-Key."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from periodic_manager.clock import SystemClock
from periodic_manager.settings import Settings

if TYPE_CHECKING:
    from periodic_manager.db import http_deliveries

MAX_ID = 2**63 - 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The actions of ``dead-letters`` and their arguments."""
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="print the dead letters, oldest first")
    listing.add_argument("--schedule", default=None, help="only this schedule's")
    listing.add_argument("--limit", type=int, default=100, help="at most this many (1-10000)")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    for action, what in (("replay", "send again, same key"), ("purge", "delete")):
        sub = actions.add_parser(
            action, help=f"{what}: the dead letters of IDs, --schedule or --all"
        )
        sub.add_argument("ids", nargs="*", type=int, metavar="ID", help="dead letter ids")
        sub.add_argument("--schedule", default=None, help="those of this schedule")
        sub.add_argument("--all", action="store_true", help="every dead letter")


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Run the action; bad arguments: one line, status 2; the database unusable: status 1."""
    from periodic_manager.cli.files import _fail, _on_database

    if args.action == "list" and not 1 <= args.limit <= 10_000:
        return _fail(f"--limit: must be from 1 to 10000 (got {args.limit})")
    if args.action != "list":
        if any(not 1 <= i <= MAX_ID for i in args.ids):
            return _fail("ID: dead letter ids are positive integers")
        if not args.ids and args.schedule is None and not args.all:
            return _fail("name IDs, --schedule NAME or --all (every dead letter)")
    return _on_database(settings, lambda: _act(args, settings))


async def _act(args: argparse.Namespace, settings: Settings) -> int:
    from periodic_manager.db import http_deliveries
    from periodic_manager.db.engine import create_engine

    engine = create_engine(settings.database_url)
    try:
        async with engine.connect() as conn:
            if args.action == "list":
                found = await http_deliveries.dead_letters(
                    conn, schedule=args.schedule, limit=args.limit
                )
                for letter in found:
                    print(_line(letter, as_json=args.json))
                return 0
            ids = args.ids or None
            if args.action == "replay":
                count = await http_deliveries.replay(
                    conn, SystemClock().now(), ids=ids, schedule=args.schedule
                )
            else:
                count = await http_deliveries.purge(conn, ids=ids, schedule=args.schedule)
    finally:
        await engine.dispose()
    print(f"{count} dead letter(s) {'replayed' if args.action == 'replay' else 'purged'}")
    if ids and count < len(set(ids)):
        print(f"{len(set(ids)) - count} of the ids named no dead letter", file=sys.stderr)
        return 3
    return 0


def _line(letter: http_deliveries.DeadLetter, *, as_json: bool) -> str:
    fields = {
        "id": letter.id,
        "schedule": letter.schedule,
        "slot": letter.slot.isoformat(),
        "idempotency_key": letter.idempotency_key,
        "url": letter.url,
        "attempts": letter.attempts,
        "last_status": letter.last_status,
        "last_error": letter.last_error,
        "body_excerpt": letter.body_excerpt,
        "dead_at": letter.dead_at.isoformat() if letter.dead_at else None,
    }
    if as_json:
        return json.dumps(fields, ensure_ascii=False)
    status = letter.last_status if letter.last_status is not None else "-"
    return (
        f"{letter.id}\t{letter.idempotency_key}\tstatus {status}\t"
        f"{letter.attempts} attempt(s)\t{letter.last_error or ''}"
    )
