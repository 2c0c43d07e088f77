"""The dashboard's shell: one HTML page for every ``/ui`` URL, and its static files.

The shell and the files hold no data: the page's script reads everything from the API with the
caller's token (asked once, kept in ``sessionStorage``), so these paths are open without a token
(``api.auth``). Every asset ships in the package (``api/ui/static``) and is served from memory.
Asset URLs carry a version (a hash of all of them: ``/ui/static/<version>/app.js``), so the
browser keeps them for good and asks only for the shell again (``no-cache`` with an ``ETag``);
modules import each other by relative URL and so stay within one version. The
Content-Security-Policy lets the page load and fetch from its own origin only, so nothing can
come from another host.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

MEDIA_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".html": "text/html; charset=utf-8",
}
# Every URL the dashboard answers; anything else under /ui is the shell with a 404 status.
PAGES = re.compile(
    r"/ui(/|/schedules/?|/schedules/new|/schedules/[0-9]{1,18}(/edit)?|/managers|/calendars|/dead-letters)?"
)
# frame-ancestors 'none' (and X-Frame-Options) are added to every HTML answer by api.guard.NoFraming.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; form-action 'self'; base-uri 'none'"
)
IMMUTABLE = "public, max-age=31536000, immutable"
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    media_type: str
    etag: str


def _load_assets() -> dict[str, Asset]:
    assets: dict[str, Asset] = {}
    folder = resources.files("periodic_manager.api.ui") / "static"
    for item in folder.iterdir():
        suffix = "." + item.name.rsplit(".", 1)[-1]
        if item.is_file() and suffix in MEDIA_TYPES:
            body = item.read_bytes()
            digest = hashlib.sha256(body).hexdigest()[:16]
            assets[item.name] = Asset(body, MEDIA_TYPES[suffix], f'"{digest}"')
    return assets


def _version(assets: dict[str, Asset]) -> str:
    digest = hashlib.sha256()
    for name in sorted(assets):
        digest.update(f"{name}\0{assets[name].etag}\0".encode())
    return digest.hexdigest()[:12]


def _send(request: Request, asset: Asset, status: int = 200, cache: str = "no-cache") -> Response:
    headers = {**SECURITY_HEADERS, "ETag": asset.etag, "Cache-Control": cache}
    if status == 200 and request.headers.get("if-none-match") == asset.etag:
        return Response(status_code=304, headers=headers)
    return Response(asset.body, status_code=status, media_type=asset.media_type, headers=headers)


def ui_router() -> APIRouter:
    """Routes of ``/`` (a redirect to ``/ui``), ``/ui/static/<file>`` and every page URL."""
    assets = _load_assets()
    page = assets.pop("index.html")
    version = _version(assets)
    body = page.body.replace(b"/ui/static/", f"/ui/static/{version}/".encode())
    shell = Asset(body, page.media_type, f'"{hashlib.sha256(body).hexdigest()[:16]}"')
    router = APIRouter(include_in_schema=False)

    @router.get("/")
    async def root() -> RedirectResponse:
        return RedirectResponse("/ui", status_code=307)

    @router.get("/ui/static/{tag}/{name}")
    async def static(tag: str, name: str, request: Request) -> Response:
        asset = assets.get(name)
        if asset is None:
            return Response("not found", status_code=404, media_type="text/plain")
        # Another version's URL (a page loaded before an upgrade) gets today's file, uncached.
        cache = IMMUTABLE if tag == version else "no-cache"
        return _send(request, asset, cache=cache)

    @router.get("/ui")
    @router.get("/ui/{path:path}")
    async def pages(request: Request) -> Response:
        known = PAGES.fullmatch(request.url.path) is not None
        return _send(request, shell, 200 if known else 404)

    return router
