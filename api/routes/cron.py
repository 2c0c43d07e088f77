"""Preview a spec before saving it: the next slots and a description."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated
from zoneinfo import ZoneInfo

from fastapi import APIRouter, Depends, Query
from pydantic import AwareDatetime

from periodic_manager.errors import ConfigError
from periodic_manager.schedules.describe import describe
from periodic_manager.schedules.judge import parse_schedule
from periodic_manager.schedules.slots import Rule

from ..deps import get_now
from ..errors import ApiProblem, config_error_item
from ..rows import SLOT_ERRORS
from ..schemas import CronPreview, Slot

router = APIRouter(prefix="/cron", tags=["cron"])
# Query parameter of each field parse_schedule may name.
PARAMS = {"spec": "spec", "timezone": "tz", "anchor": "anchor"}


@router.get(
    "/next", response_model=CronPreview, summary="The next slots of a spec (no schedule needed)"
)
async def next_slots(
    now: Annotated[datetime, Depends(get_now)],
    spec: Annotated[str, Query(max_length=200, description="cron expression, macro or `@every`")],
    tz: Annotated[str, Query(max_length=64, description="IANA zone")] = "UTC",
    n: Annotated[int, Query(ge=1, le=100, description="how many slots")] = 5,
    anchor: Annotated[
        AwareDatetime | None, Query(description="phase of an `@every` interval")
    ] = None,
) -> CronPreview:
    try:
        schedule = parse_schedule(spec, tz, anchor)
    except ConfigError as exc:
        item = config_error_item(exc, "query")
        item["field"] = PARAMS.get(exc.field, exc.field)
        raise ApiProblem(422, "validation-error", "1 invalid field", errors=[item]) from None
    zone = ZoneInfo(tz)
    slots: list[Slot] = []
    # The slot rule, as every preview (no slot before year 10000: the list is shorter).
    for at, _ in Rule(schedule).upcoming(now, n):
        try:  # an @every slot near year 9999 may have no local time east of UTC: an error too
            local = at.astimezone(zone).isoformat()
        except SLOT_ERRORS:
            break
        slots.append(Slot(at=at, local=local))
    return CronPreview(spec=spec, timezone=tz, description=describe(spec), next=slots)
