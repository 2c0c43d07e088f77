"""Swagger UI at ``/docs``, with its JavaScript and CSS served from the installed
``swagger-ui-bundle-v2`` package, so the page works without Internet access (no CDN)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

from ..errors import problem_response

router = APIRouter(include_in_schema=False)
ASSETS_PATH = "/docs/assets"
# The only files the page needs; nothing else of the package is served.
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon-32x32.png": "image/png",
}


@cache
def _assets_dir() -> Path:
    from swagger_ui_bundle import swagger_ui_path

    return Path(str(swagger_ui_path))


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    root = str(request.scope.get("root_path", "")).rstrip("/")  # behind a path-prefix proxy
    assets = root + ASSETS_PATH
    return get_swagger_ui_html(
        openapi_url=root + request.app.openapi_url,
        title=f"{request.app.title} API",
        swagger_js_url=f"{assets}/swagger-ui-bundle.js",
        swagger_css_url=f"{assets}/swagger-ui.css",
        swagger_favicon_url=f"{assets}/favicon-32x32.png",
        # Swagger UI would otherwise ask validator.swagger.io to badge the document.
        swagger_ui_parameters={"validatorUrl": None},
    )


@router.get(ASSETS_PATH + "/{name}")
async def swagger_asset(name: str) -> FileResponse:
    media_type = ASSETS.get(name)
    if media_type is None:
        return problem_response(404, "not-found", f"no documentation asset {name!r}")  # type: ignore[return-value]
    return FileResponse(
        _assets_dir() / name,
        media_type=media_type,
        headers={"Cache-Control": "public, max-age=86400"},
    )
