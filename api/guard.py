"""What a web page must not be able to do to the API through the user's browser.

The API listens on 127.0.0.1 without a token by default, so any page the user visits can aim
requests at it. Two attacks need no preflight and are refused here, before authentication:

- **DNS rebinding**: a page on ``evil.example`` rebinds its name to 127.0.0.1 and reads or writes
  through the browser as if same-origin. The browser still sends ``Host: evil.example``, so only
  the configured host names are answered (``PM_ALLOWED_HOSTS``; by default the loopback names
  and the bind address): any other gets a 421 problem. ``/healthz`` and ``/readyz`` answer any
  Host (Kubernetes probes send the pod's IP) and reveal nothing that could be abused.
- **Cross-site writes**: a form or a ``fetch(..., {mode: "no-cors"})`` POST with a
  ``text/plain`` body. A write (any method but GET and HEAD) is refused with 403 when the
  browser says it comes from another site (``Sec-Fetch-Site`` other than ``same-origin`` or
  ``none``, or an ``Origin`` that is not this server's), and with 415 when it carries a body
  whose type is not JSON. Non-browser clients (curl, SDKs) send neither header and pass.

A third needs no request from the page at all: **framing** (clickjacking). A page shows the
dashboard or Swagger UI in an invisible frame and lures the user into clicking its buttons
(*Delete*, *Try it out*). :class:`NoFraming` marks every HTML response, whatever route made it,
``X-Frame-Options: DENY`` and CSP ``frame-ancestors 'none'``, so no browser shows it in a frame.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from periodic_manager.runtime.startup import is_loopback
from periodic_manager.settings import Settings

from .errors import problem_response
from .middleware import HttpMiddleware

log = logging.getLogger(__name__)

SAFE_METHODS = frozenset({"GET", "HEAD"})
ANY_HOST_PATHS = frozenset({"/healthz", "/readyz"})
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_BINDS = frozenset({"0.0.0.0", "::", ""})
DEFAULT_PORTS = {"http": 80, "https": 443}
NO_FRAMES = b"frame-ancestors 'none'"


def split_host(value: str) -> tuple[str, int | None]:
    """``Host`` header value -> (lower-case name without brackets or trailing dot, port)."""
    value = value.strip().lower()
    port: int | None = None
    if value.startswith("["):  # [v6]:port
        name, _, rest = value[1:].partition("]")
        if rest.startswith(":") and rest[1:].isdigit():
            port = int(rest[1:])
        return name, port
    name, sep, tail = value.rpartition(":")
    if sep and tail.isdigit() and ":" not in name:
        return name.rstrip("."), int(tail)
    return value.rstrip("."), None


def allowed_hosts(settings: Settings) -> tuple[str, ...]:
    """The host patterns the API answers: ``PM_ALLOWED_HOSTS``, else the loopback names and a
    specific bind address."""
    if settings.allowed_hosts:
        return settings.allowed_hosts
    bind = settings.host.strip("[]").lower()
    extra = () if bind in WILDCARD_BINDS or bind in LOOPBACK_NAMES else (bind,)
    return (*LOOPBACK_NAMES, *extra)


class HostMatcher:
    """Exact names, ``*.example.com`` (any subdomain) and ``*`` (anything)."""

    def __init__(self, patterns: Iterable[str]) -> None:
        patterns = [p.strip().lower().rstrip(".") for p in patterns if p.strip()]
        self.any = "*" in patterns
        self.exact = frozenset(split_host(p)[0] for p in patterns if not p.startswith("*."))
        self.suffixes = tuple(p[1:] for p in patterns if p.startswith("*."))

    def __call__(self, name: str) -> bool:
        if self.any:
            return True
        return name in self.exact or (bool(name) and name.endswith(self.suffixes))


def _headers(scope: Scope) -> dict[bytes, bytes]:
    # The first of each name: enough for these single-valued headers.
    out: dict[bytes, bytes] = {}
    for key, value in scope.get("headers", ()):
        out.setdefault(key, value)
    return out


def same_origin(origin: str, host: str) -> bool:
    """Whether ``Origin`` names the server the request was sent to (by its ``Host``)."""
    try:
        parts = urlsplit(origin)
        origin_port = parts.port
    except ValueError:
        return False
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return False
    name, port = split_host(host)
    if parts.hostname.rstrip(".") != name:
        return False
    default = DEFAULT_PORTS[parts.scheme]
    # Behind a TLS proxy the Host has no port while the Origin is https: compare effective ports.
    return (origin_port or default) == (port or default)


def is_json_media_type(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    kind, _, subtype = media.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


class BrowserGuard(HttpMiddleware):
    """ASGI middleware: Host allow-list, cross-site write refusal, JSON-only request bodies."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        super().__init__(app)
        self.hosts = HostMatcher(allowed_hosts(settings))

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self.refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, slug, detail = refusal
        log.debug("refused %s %s: %s", scope["method"], scope["path"], detail)
        await problem_response(status, slug, detail)(scope, receive, send)

    def refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        headers = _headers(scope)
        host = headers.get(b"host", b"").decode("latin-1")
        if scope["path"] not in ANY_HOST_PATHS and not self.hosts(split_host(host)[0]):
            return (
                421,
                "host-not-allowed",
                f"this server does not answer for Host {host!r}; allowed hosts are set with "
                "PM_ALLOWED_HOSTS",
            )
        if scope["method"] in SAFE_METHODS:
            return None
        site = headers.get(b"sec-fetch-site")
        if site is not None and site.lower() not in (b"same-origin", b"none"):
            return (
                403,
                "cross-site-request",
                f"cross-site write refused (Sec-Fetch-Site: {site.decode('latin-1')})",
            )
        origin = headers.get(b"origin")
        if origin is not None and not same_origin(origin.decode("latin-1"), host):
            return (
                403,
                "cross-site-request",
                f"cross-site write refused (Origin: {origin.decode('latin-1')})",
            )
        content_type = headers.get(b"content-type")
        has_body = (
            headers.get(b"content-length", b"0").strip() not in (b"0", b"")
            or b"transfer-encoding" in headers
        )
        if (content_type is not None or has_body) and not is_json_media_type(
            (content_type or b"").decode("latin-1")
        ):
            given = content_type.decode("latin-1") if content_type is not None else "none"
            return (
                415,
                "unsupported-media-type",
                f"a request body must be JSON (Content-Type: application/json), got {given}",
            )
        return None


class NoFraming(HttpMiddleware):
    """ASGI middleware: every ``text/html`` response gets ``X-Frame-Options: DENY`` (older
    browsers) and ``frame-ancestors 'none'`` in its Content-Security-Policy (added to a page's
    own policy, or as the whole policy when the page has none)."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def framing_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": no_framing(message.get("headers", ()))}
            await send(message)

        await self.app(scope, receive, framing_send)


def no_framing(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """``headers`` of a response, with the framing refusal added if it is HTML."""
    out = list(headers)
    kind = next((v for k, v in out if k.lower() == b"content-type"), b"")
    if kind.split(b";", 1)[0].strip().lower() != b"text/html":
        return out
    if not any(k.lower() == b"x-frame-options" for k, _ in out):
        out.append((b"x-frame-options", b"DENY"))
    policies = [i for i, (k, _) in enumerate(out) if k.lower() == b"content-security-policy"]
    if not any(b"frame-ancestors" in out[i][1].lower() for i in policies):
        if policies:  # one policy that says everything, rather than two to read together
            i = policies[0]
            out[i] = (out[i][0], out[i][1].rstrip(b"; ") + b"; " + NO_FRAMES)
        else:
            out.append((b"content-security-policy", NO_FRAMES))
    return out


def warn_if_unreachable_by_name(settings: Settings) -> bool:
    """Log a warning when the API binds beyond loopback but answers loopback names only."""
    if settings.allowed_hosts or is_loopback(settings.host):
        return False
    log.warning(
        "the API binds to %s but answers only Host %s: set PM_ALLOWED_HOSTS to the names "
        "clients use (or * when a proxy or the token protects it)",
        settings.host,
        ", ".join(allowed_hosts(settings)),
    )
    return True
