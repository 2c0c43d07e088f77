"""The http target's dead letters: deliveries that got a permanent answer or spent their attempts
or age (rows of ``pm_http_deliveries`` in state ``dead``). Listed, replayed (pending again, due
now, attempts from zero, the same Idempotency-Key: the receiver can tell a replay from a new
slot) and purged."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, Field

from periodic_manager.db import http_deliveries
from periodic_manager.errors import ConfigError

from ..deps import Conn, Now
from ..errors import ApiProblem

router = APIRouter(prefix="/dead-letters", tags=["dead letters"])

LetterId = Annotated[int, Path(ge=1, le=2**63 - 1, description="the dead letter's id")]
Schedule = Annotated[
    str | None, Query(min_length=1, max_length=200, description="a schedule's name")
]


class DeadLetterOut(BaseModel):
    id: int
    schedule: str
    slot: datetime
    idempotency_key: str
    url: str
    attempts: int
    last_status: int | None = Field(description="the receiver's last status (none: no answer)")
    last_error: str | None
    body_excerpt: str | None = Field(description="the first 1000 characters of the last answer")
    created_at: datetime = Field(description="when the delivery (or its last replay) began")
    dead_at: datetime | None


class DeadLetterPage(BaseModel):
    items: list[DeadLetterOut]
    next_after_id: int | None = Field(description="pass as after_id for the next page")


class ReplayFilter(BaseModel):
    """Which dead letters to replay or purge: those of ``ids`` and of ``schedule``; ``all``
    true (and neither) for every one."""

    ids: list[Annotated[int, Field(ge=1, le=2**63 - 1)]] | None = Field(None, max_length=10_000)
    schedule: str | None = Field(None, min_length=1, max_length=200)
    all: bool = False


class Count(BaseModel):
    count: int


@router.get("", response_model=DeadLetterPage, summary="Dead letters, oldest first")
async def list_dead_letters(
    conn: Conn,
    schedule: Schedule = None,
    after_id: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> DeadLetterPage:
    found = await http_deliveries.dead_letters(
        conn, schedule=schedule, after_id=after_id, limit=limit
    )
    items = [_out(x) for x in found]
    return DeadLetterPage(items=items, next_after_id=found[-1].id if len(found) == limit else None)


@router.post(
    "/{letter_id}/replay",
    response_model=Count,
    responses={404: {"description": "No dead letter has this id"}},
    summary="Replay one dead letter",
)
async def replay_one(letter_id: LetterId, conn: Conn, now: Now) -> Count:
    count = await http_deliveries.replay(conn, now, ids=[letter_id])
    if count == 0:
        raise ApiProblem(404, "not-found", f"dead letter {letter_id} not found")
    return Count(count=count)


@router.post("/replay", response_model=Count, summary="Replay the dead letters a filter chooses")
async def replay_many(chosen: ReplayFilter, conn: Conn, now: Now) -> Count:
    _chosen(chosen)
    count = await http_deliveries.replay(conn, now, ids=chosen.ids, schedule=chosen.schedule)
    return Count(count=count)


@router.post("/purge", response_model=Count, summary="Delete the dead letters a filter chooses")
async def purge_many(chosen: ReplayFilter, conn: Conn) -> Count:
    _chosen(chosen)
    return Count(count=await http_deliveries.purge(conn, ids=chosen.ids, schedule=chosen.schedule))


def _chosen(chosen: ReplayFilter) -> None:
    if chosen.ids is None and chosen.schedule is None and not chosen.all:
        raise ConfigError("all", "name ids or a schedule, or set all to true for every dead letter")


def _out(letter: http_deliveries.DeadLetter) -> DeadLetterOut:
    return DeadLetterOut(
        id=letter.id,
        schedule=letter.schedule,
        slot=letter.slot,
        idempotency_key=letter.idempotency_key,
        url=letter.url,
        attempts=letter.attempts,
        last_status=letter.last_status,
        last_error=letter.last_error,
        body_excerpt=letter.body_excerpt,
        created_at=letter.created_at,
        dead_at=letter.dead_at,
    )
