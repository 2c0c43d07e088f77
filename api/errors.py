"""Every error the API returns, mapped in one place.

422 bodies share one shape whether FastAPI's own validation or the domain's ConfigError found
the problem: ``{"detail": [{"loc": ["body", ...], "msg": str, "type": str}]}``.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from periodic_manager.errors import ConfigError, NotFoundError, PeriodicManagerError


class ScheduleNotFound(NotFoundError):
    """No schedule row with this id."""

    def __str__(self) -> str:
        return f"schedule {self.key} not found"


class NameConflict(PeriodicManagerError):
    """Another schedule already has this name."""

    def __init__(self, name: str) -> None:
        super().__init__(f"a schedule named {name!r} already exists")
        self.name = name


def error_item(loc: list[str | int], msg: str, type_: str) -> dict[str, Any]:
    return {"loc": loc, "msg": msg, "type": type_}


def _json_safe_loc(loc: Any) -> list[str | int]:
    return [p if isinstance(p, str | int) else str(p) for p in loc]


def config_error_item(exc: ConfigError) -> dict[str, Any]:
    loc: list[str | int] = ["body", *exc.field.split(".")]
    return error_item(loc, exc.reason, exc.code)


async def _on_config_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ConfigError)
    return JSONResponse({"detail": [config_error_item(exc)]}, status_code=422)


async def _on_validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    # Only loc/msg/type: FastAPI's "input"/"ctx" may echo values that are not JSON-safe.
    items = [
        error_item(_json_safe_loc(e.get("loc", ())), str(e.get("msg", "")), str(e.get("type", "")))
        for e in exc.errors()
    ]
    return JSONResponse({"detail": items}, status_code=422)


async def _on_not_found(_: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=404)


async def _on_conflict(_: Request, exc: Exception) -> JSONResponse:
    item = error_item(["body", "name"], str(exc), "conflict")
    return JSONResponse({"detail": [item]}, status_code=409)


async def _on_http_error(request: Request, exc: Exception) -> Any:
    assert isinstance(exc, StarletteHTTPException)
    # FastAPI turns body-decoding failures other than JSONDecodeError (invalid UTF-8, integers
    # beyond Python's digit limit, nesting beyond the recursion limit) into a bare 400. They are
    # bad input like any malformed JSON, so answer them the same way.
    if exc.status_code == 400 and isinstance(exc.__cause__, ValueError | RecursionError):
        reason = "JSON decode error"
        if not isinstance(exc.__cause__, json.JSONDecodeError):
            reason = f"JSON decode error: {type(exc.__cause__).__name__}"
        return JSONResponse(
            {"detail": [error_item(["body"], reason, "json_invalid")]}, status_code=422
        )
    return await http_exception_handler(request, exc)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(ConfigError, _on_config_error)
    app.add_exception_handler(NotFoundError, _on_not_found)
    app.add_exception_handler(NameConflict, _on_conflict)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
