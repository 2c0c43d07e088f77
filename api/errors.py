"""Every error the API returns, mapped in one place, as RFC 9457 problem details.

Every 4xx/5xx body is ``application/problem+json``::

    {"type": "urn:periodic-manager:problem:validation-error", "title": "Unprocessable Content",
     "status": 422, "detail": "1 invalid field",
     "errors": [{"location": "body", "field": "spec", "reason": "...", "code": "never-fires"}]}

``errors`` (validation errors and name conflicts only) names each field: ``location`` is where it
was (body, query, path, header), ``field`` the dotted path inside it (``options.queue``; null when
the whole location is at fault, e.g. a body that is not JSON), ``reason`` why, ``code`` a
machine-readable kind. ``type`` is a URN per kind of problem, or ``about:blank`` when the HTTP
status says it all (RFC 9457 section 4.2.1).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from periodic_manager.errors import ConfigError, NameConflict, NotFoundError, PeriodicManagerError
from periodic_manager.schedules.judge import Problem
from periodic_manager.schedules.rules import TOO_LARGE

log = logging.getLogger(__name__)

PROBLEM_MEDIA_TYPE = "application/problem+json"
HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
URN = "urn:periodic-manager:problem:"


class ScheduleNotFound(NotFoundError):
    """No schedule row with this id (or name)."""

    def __str__(self) -> str:
        return f"schedule {self.key} not found"


class ApiProblem(PeriodicManagerError):
    """An error with its HTTP status and problem type, raised by routes and middleware."""

    def __init__(
        self,
        status: int,
        slug: str | None,
        detail: str | None = None,
        *,
        errors: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail or HTTPStatus(status).phrase)
        self.status = status
        self.slug = slug
        self.detail = detail
        self.errors = errors
        self.headers = headers
        self.extra = extra or {}


def error_item(location: str, field: str | None, reason: str, code: str) -> dict[str, Any]:
    return {"location": location, "field": field, "reason": reason, "code": code}


def problem_body(
    status: int,
    slug: str | None,
    detail: str | None = None,
    errors: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": URN + slug if slug else "about:blank",
        "title": HTTPStatus(status).phrase,
        "status": status,
    }
    if detail is not None:
        body["detail"] = detail
    if errors is not None:
        body["errors"] = errors
    body.update(extra)
    return body


def problem_response(
    status: int,
    slug: str | None,
    detail: str | None = None,
    errors: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    return JSONResponse(
        problem_body(status, slug, detail, errors, **extra),
        status_code=status,
        headers=headers,
        media_type=PROBLEM_MEDIA_TYPE,
    )


def _invalid(n: int) -> str:
    return f"{n} invalid field" + ("s" if n != 1 else "")


def validation_response(errors: list[dict[str, Any]]) -> JSONResponse:
    return problem_response(422, "validation-error", _invalid(len(errors)), errors)


def judged_problem(problems: Sequence[Problem]) -> ApiProblem:
    """A write the judge refused (``periodic_manager.schedules.judge``): a 422 naming each
    field, or a 413 when its first problem is a payload or options over the size limit."""
    items = [error_item("body", p.field, p.reason, p.code) for p in problems]
    first = problems[0]
    if first.code == TOO_LARGE:
        return ApiProblem(413, "payload-too-large", f"{first.field}: {first.reason}", errors=items)
    return ApiProblem(422, "validation-error", _invalid(len(items)), errors=items)


def config_error_item(exc: ConfigError, location: str = "body") -> dict[str, Any]:
    return error_item(location, exc.field, exc.reason, exc.code)


def _item_from_pydantic(err: Any) -> dict[str, Any]:
    loc = [p if isinstance(p, str | int) else str(p) for p in err.get("loc", ())]
    location = str(loc[0]) if loc else "body"
    if err.get("type") == "json_invalid":
        # FastAPI puts the character offset where a field name belongs; the whole body is at
        # fault, so no field, and the offset goes into the reason.
        ctx = err.get("ctx") or {}
        at = f" at character {loc[1]}" if len(loc) > 1 and isinstance(loc[1], int) else ""
        reason = f"not valid JSON: {ctx.get('error') or 'decode error'}{at}"
        return error_item(location, None, reason, "json_invalid")
    field = ".".join(str(p) for p in loc[1:]) or None
    # Only loc/msg/type: pydantic's "input"/"ctx" may echo values that are not JSON-safe.
    return error_item(location, field, str(err.get("msg", "")), str(err.get("type", "")))


async def _on_config_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ConfigError)
    return validation_response([config_error_item(exc)])


async def _on_validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return validation_response([_item_from_pydantic(e) for e in exc.errors()])


async def _on_not_found(_: Request, exc: Exception) -> JSONResponse:
    return problem_response(404, "not-found", str(exc))


async def _on_conflict(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, NameConflict)
    item = error_item("body", "name", str(exc), "conflict")
    return problem_response(409, "name-conflict", str(exc), [item])


async def _on_api_problem(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiProblem)
    return problem_response(exc.status, exc.slug, exc.detail, exc.errors, exc.headers, **exc.extra)


async def _on_http_error(request: Request, exc: Exception) -> Any:
    assert isinstance(exc, StarletteHTTPException)
    # FastAPI turns body-decoding failures other than JSONDecodeError (invalid UTF-8, integers
    # beyond Python's digit limit, nesting beyond the recursion limit) into a bare 400. They are
    # bad input like any malformed JSON, so answer them the same way.
    if exc.status_code == 400 and isinstance(exc.__cause__, ValueError | RecursionError):
        reason = "JSON decode error"
        if not isinstance(exc.__cause__, json.JSONDecodeError):
            reason = f"JSON decode error: {type(exc.__cause__).__name__}"
        return validation_response([error_item("body", None, reason, "json_invalid")])
    detail: str | None = exc.detail if isinstance(exc.detail, str) else None
    if detail == HTTPStatus(exc.status_code).phrase:
        detail = None
    headers = dict(exc.headers) if exc.headers is not None else None
    if exc.status_code == 405:
        # Starlette names only the methods of the first route that matched the path; the
        # other routes of that path (GET/PATCH/DELETE of one schedule are three) count too.
        headers = {**(headers or {}), "Allow": ", ".join(allowed_methods(request))}
    slug = {413: "payload-too-large"}.get(exc.status_code)
    return problem_response(exc.status_code, slug, detail, headers=headers)


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at the request's path (HEAD wherever GET is), found by
    asking the routes to match the path under each method (routers may nest routes)."""
    methods = [
        method
        for method in HTTP_METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] == Match.FULL
            for route in request.app.router.routes
        )
    ]
    if "GET" in methods and "HEAD" not in methods:
        methods.append("HEAD")
    return sorted(methods)


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return problem_response(500, None, "unexpected error; see the server log")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(ConfigError, _on_config_error)
    app.add_exception_handler(NotFoundError, _on_not_found)
    app.add_exception_handler(NameConflict, _on_conflict)
    app.add_exception_handler(ApiProblem, _on_api_problem)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected)
