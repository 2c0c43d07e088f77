"""The API through real HTTP to a real uvicorn: what a web page in the user's browser cannot do
(DNS rebinding, cross-site writes, non-JSON bodies), what a same-origin page (the dashboard,
Swagger UI) still can, and the edges of the HTTP contract (413 for huge bodies, HEAD, 405 Allow,
malformed JSON, Swagger UI without a CDN)."""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import uvicorn
from starlette.responses import PlainTextResponse

from periodic_manager.api import unsent
from periodic_manager.api.app import create_app
from periodic_manager.cli.main import bind_socket
from periodic_manager.db.migrate import upgrade_sync
from periodic_manager.settings import Settings
from tests.support.browser import Server

EVIL = "https://evil.example"

# anyio imports its file helpers lazily, on the first FileResponse. Under pytest that import is
# rewritten (anyio is a pytest plugin) with ast.parse, which on Python 3.11 can fail with
# "AST constructor recursion depth mismatch" when it runs in the server's thread. Import it here.
assert anyio.open_file is not None


@contextmanager
def serving(settings: Settings) -> Iterator[str]:
    """The app of ``settings`` served by uvicorn on a free loopback port; yields its base URL."""
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(settings), log_level="error"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            if server.started:
                break
            time.sleep(0.05)
        assert server.started, "the API did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite+aiosqlite:///{Path(tmp_path_factory.mktemp('guard')) / 'pm.db'}"
    upgrade_sync(url)
    return url


@pytest.fixture(scope="module")
def base(database: str) -> Iterator[str]:
    with serving(Settings(database_url=database, target="outbox")) as url:
        yield url


@pytest.fixture
def client(base: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base, timeout=10) as c:
        yield c


@pytest.fixture
def schedule(client: httpx.Client) -> dict[str, Any]:
    name = f"guard.{time.monotonic_ns()}"
    r = client.post("/schedules", json={"name": name, "spec": "0 6 * * *", "task_type": "t"})
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


def problem(r: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = r.json()
    assert body["type"] == f"urn:periodic-manager:problem:{slug}" and body["status"] == status
    return body


def test_a_foreign_host_is_refused_so_dns_rebinding_reads_nothing(
    client: httpx.Client, base: str
) -> None:
    port = base.rsplit(":", 1)[1]
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", ""):
        body = problem(client.get("/schedules", headers={"Host": host}), 421, "host-not-allowed")
        assert "PM_ALLOWED_HOSTS" in body["detail"]
        problem(client.post("/schedules", json={}, headers={"Host": host}), 421, "host-not-allowed")
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "LOCALHOST"):
        assert client.get("/schedules", headers={"Host": host}).status_code == 200, host
    # Probes answer any Host (Kubernetes sends the pod's address).
    assert client.get("/healthz", headers={"Host": "10.1.2.3:8000"}).status_code == 200
    assert client.get("/readyz", headers={"Host": "10.1.2.3:8000"}).status_code == 200


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": EVIL, "content-type": "text/plain"},  # a form or no-cors fetch
        {"Origin": EVIL},
        {"Origin": "null"},  # sandboxed frames, file:// pages
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},  # another port or subdomain of the same site
        {"Origin": "http://localhost:1"},  # another local app
    ],
)
def test_cross_site_writes_are_refused(
    client: httpx.Client, schedule: dict[str, Any], headers: dict[str, str]
) -> None:
    sid = schedule["id"]
    for path in (
        f"/schedules/{sid}/pause",
        f"/schedules/{sid}/trigger",
        f"/schedules/{sid}/resume",
    ):
        problem(client.post(path, headers=headers), 403, "cross-site-request")
    problem(
        client.patch(f"/schedules/{sid}", json={"enabled": False}, headers=headers),
        403,
        "cross-site-request",
    )
    problem(client.delete(f"/schedules/{sid}", headers=headers), 403, "cross-site-request")
    after = client.get(f"/schedules/{sid}").json()
    assert after["enabled"] is True and after["updated_at"] == schedule["updated_at"]
    assert client.get(f"/schedules/{sid}/runs").json()["total"] == 0  # no trigger went through


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None],
)
def test_write_bodies_must_be_declared_json(
    client: httpx.Client, schedule: dict[str, Any], content_type: str | None
) -> None:
    sid = schedule["id"]
    headers = {"content-type": content_type} if content_type else {}
    body = b'{"enabled": false}'
    for method, path in (
        ("PATCH", f"/schedules/{sid}"),
        ("POST", f"/schedules/{sid}/pause"),
        ("POST", "/schedules"),
    ):
        r = client.request(method, path, content=body, headers=headers)
        problem(r, 415, "unsupported-media-type")
    assert client.get(f"/schedules/{sid}").json()["enabled"] is True


def test_same_origin_browser_requests_pass(
    client: httpx.Client, base: str, schedule: dict[str, Any]
) -> None:
    """What the dashboard at /ui and Swagger UI at /docs send: same-origin fetch() with JSON."""
    sid = schedule["id"]
    browser = {"Origin": base, "Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"}
    json_headers = {**browser, "content-type": "application/json"}
    assert client.post(f"/schedules/{sid}/pause", headers=browser).status_code == 200
    assert client.post(f"/schedules/{sid}/resume", headers=json_headers).status_code == 200
    assert client.post(f"/schedules/{sid}/trigger", headers=browser).status_code == 202
    r = client.patch(
        f"/schedules/{sid}", json={"description": "from the dashboard"}, headers=browser
    )
    assert r.status_code == 200 and r.json()["description"] == "from the dashboard"
    name = f"guard.browser.{time.monotonic_ns()}"
    r = client.post(
        "/schedules", json={"name": name, "spec": "@daily", "task_type": "t"}, headers=browser
    )
    assert r.status_code == 201, r.text
    # A typed URL or a bookmark (Sec-Fetch-Site: none), and the same host named otherwise.
    assert (
        client.post(f"/schedules/{sid}/pause", headers={"Sec-Fetch-Site": "none"}).status_code
        == 200
    )
    port = base.rsplit(":", 1)[1]
    other_name = {"Origin": f"http://localhost:{port}", "Host": f"localhost:{port}"}
    assert client.post(f"/schedules/{sid}/resume", headers=other_name).status_code == 200
    assert client.delete(f"/schedules/{r.json()['id']}", headers=browser).status_code == 204


def test_allowed_hosts_are_configurable(database: str) -> None:
    settings = Settings(database_url=database, allowed_hosts="pm.example.com, *.corp.example")
    with serving(settings) as base, httpx.Client(base_url=base, timeout=10) as c:
        for host, status in [
            ("pm.example.com", 200),
            ("PM.example.com:8443", 200),
            ("a.b.corp.example", 200),
            ("corp.example", 421),
            ("127.0.0.1", 421),
            ("pm.example.com.evil.example", 421),
        ]:
            assert c.get("/schedules", headers={"Host": host}).status_code == status, host
        # Behind a TLS proxy: the Origin is https, the Host has no port.
        origin = {"Host": "pm.example.com", "Origin": "https://pm.example.com"}
        assert c.post("/schedules/999999/pause", headers=origin).status_code == 404
    with (
        serving(Settings(database_url=database, allowed_hosts="*")) as base,
        httpx.Client(base_url=base) as c,
    ):
        assert c.get("/schedules", headers={"Host": "anything.example"}).status_code == 200


def _raw_exchange(
    base: str, request: bytes, body_chunks: Callable[[], Iterator[bytes]]
) -> tuple[bytes, int]:
    """Send ``request`` then body chunks until the server answers; (response head, bytes sent)."""
    host, port = base.removeprefix("http://").split(":")
    sent = 0
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)
        s.setblocking(False)
        response = b""
        for chunk in body_chunks():
            try:
                response += s.recv(65536)
            except BlockingIOError:
                pass
            if b"\r\n\r\n" in response:
                break
            try:
                s.sendall(chunk)
                sent += len(chunk)
            except BlockingIOError:
                time.sleep(0.01)
            except OSError:
                break  # the server closed the connection after answering
        s.setblocking(True)
        s.settimeout(10)
        while b"\r\n\r\n" not in response:
            data = s.recv(65536)
            if not data:
                break
            response += data
    return response, sent


def test_a_huge_body_is_refused_early_with_413(base: str) -> None:
    mib = b"x" * (1 << 20)
    # Declared 1 GiB: the answer comes before any body is sent.
    head = (
        b"POST /schedules HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1073741824\r\n\r\n"
    )
    response, _ = _raw_exchange(base, head, lambda: iter([]))
    assert response.startswith(b"HTTP/1.1 413 "), response[:200]
    assert b"payload-too-large" in response or b"content-length" in response.lower()
    # Chunked, no length given: refused once past the cap (1 MiB), long before 1 GiB.
    head = (
        b"POST /schedules HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"%x\r\n" % len(mib) + mib + b"\r\n"
    response, sent = _raw_exchange(base, head, lambda: iter([chunk] * 1024))
    assert response.startswith(b"HTTP/1.1 413 "), response[:200]
    assert sent < 64 * len(mib), sent


def test_head_works_where_get_does_and_405_lists_every_method(
    client: httpx.Client, schedule: dict[str, Any]
) -> None:
    sid = schedule["id"]
    for path in (f"/schedules/{sid}", "/schedules", "/entries", "/healthz", "/openapi.json"):
        got, head = client.get(path), client.head(path)
        assert head.status_code == got.status_code == 200, path
        assert head.content == b"" and head.headers["content-length"] == str(len(got.content)), path
    assert client.head("/schedules/999999").status_code == 404
    cases = {
        ("PUT", f"/schedules/{sid}"): "DELETE, GET, HEAD, PATCH",
        ("DELETE", "/schedules"): "GET, HEAD, POST",
        ("GET", f"/schedules/{sid}/pause"): "POST",
        ("HEAD", f"/schedules/{sid}/trigger"): "POST",
        ("POST", "/healthz"): "GET, HEAD",
    }
    for (method, path), allow in cases.items():
        r = client.request(method, path, headers={"content-type": "application/json"})
        assert r.status_code == 405 and r.headers["allow"] == allow, (method, path, r.headers)


def test_head_is_allowed_with_the_read_token(database: str) -> None:
    settings = Settings(database_url=database, api_token="w" * 16, api_read_token="r" * 16)
    with serving(settings) as base, httpx.Client(base_url=base) as c:
        read = {"Authorization": "Bearer " + "r" * 16}
        assert c.head("/schedules", headers=read).status_code == 200
        assert c.head("/schedules").status_code == 401
        assert c.post("/schedules/1/pause", headers=read).status_code == 403


def test_malformed_json_names_the_body_not_a_character_offset(client: httpx.Client) -> None:
    r = client.post(
        "/schedules", content=b'{"name": "x", ', headers={"content-type": "application/json"}
    )
    body = problem(r, 422, "validation-error")
    [error] = body["errors"]
    assert (
        error["location"] == "body" and error["field"] is None and error["code"] == "json_invalid"
    )
    assert re.fullmatch(r"not valid JSON: .+ at character \d+", error["reason"]), error


def test_swagger_ui_loads_nothing_from_another_host(client: httpx.Client) -> None:
    page = client.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    html = page.text
    assert "http://" not in html and "https://" not in html and "//cdn" not in html
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert len(assets) == 3 and all(a.startswith("/docs/assets/") for a in assets), assets
    for asset in assets:
        r = client.get(asset)
        assert r.status_code == 200 and len(r.content) > 100, asset
    assert (
        client.get("/docs/assets/swagger-ui-bundle.js")
        .headers["content-type"]
        .startswith("text/javascript")
    )
    assert "SwaggerUIBundle" in client.get("/docs/assets/swagger-ui-bundle.js").text
    # Only the page's own assets are served, nothing else of the package.
    assert client.get("/docs/assets/swagger-ui.js.map").status_code == 404
    assert client.get("/docs/assets/..%2F..%2F__init__.py").status_code == 404
    assert client.get("/redoc").status_code == 404


def test_no_html_page_can_be_framed_by_another_site(client: httpx.Client, database: str) -> None:
    """Clickjacking: every HTML answer of every GET route (found by walking the app's routes, so
    a new page is covered too) forbids framing, by X-Frame-Options and by CSP frame-ancestors."""
    paths = {"/ui/elsewhere", "/ui/schedules/7/edit"}  # the shell as a 404, and a deep page
    for path in get_paths(create_app(Settings(database_url=database)).routes):
        paths.add(re.sub(r"\{[^}]+\}", "1", path))
    html = set()
    for path in sorted(paths):
        for method in ("GET", "HEAD"):
            r = client.request(method, path)
            if not r.headers.get("content-type", "").startswith("text/html"):
                continue
            html.add(path)
            assert r.headers["x-frame-options"] == "DENY", (method, path)
            [policy] = r.headers.get_list("content-security-policy")
            assert policy.count("frame-ancestors") == 1 and "frame-ancestors 'none'" in policy, (
                policy
            )
    assert {"/docs", "/ui", "/ui/1", "/ui/elsewhere", "/ui/schedules/7/edit"} <= html, html
    # The dashboard keeps its own policy, with the framing rule added to it.
    shell = client.get("/ui").headers["content-security-policy"]
    assert shell.startswith("default-src 'none'; script-src 'self'") and shell.endswith(
        "frame-ancestors 'none'"
    )


def get_paths(routes: list[Any]) -> set[str]:
    """Paths of the GET routes, through included routers (nested in FastAPI >= 0.16x)."""
    found = set()
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            found |= get_paths(included.routes)
        elif "GET" in (getattr(route, "methods", None) or ()):
            found.add(route.path)
    return found


def _raw_answer(base: str, request: bytes) -> bytes:
    """Send ``request`` whole and read until the server closes the connection."""
    host, port = base.removeprefix("http://").split(":")
    answer = b""
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)
        while data := s.recv(65536):
            answer += data
    return answer


def test_a_malformed_chunked_body_costs_one_log_line_not_tracebacks(database: str) -> None:
    """Anyone can send a chunked body that is not chunked (``zz`` is no chunk size). The server
    answers it 400 while a middleware may already be answering the request itself (the guard's
    403/415/421, a 404, a 401): that answer finds the connection answered, which must not be an
    "unhandled error" with two tracebacks per request, only the server's one line."""
    head = b"POST %s HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n%s\r\n"
    body = b"zz\r\nhello\r\n0\r\n\r\n"
    cases = [
        (b"/schedules", b"127.0.0.1", b"Content-Type: text/plain\r\n"),  # guard: 415
        (b"/schedules", b"127.0.0.1", b"Origin: https://evil.example\r\n"),  # guard: 403
        (b"/schedules", b"evil.example", b"Content-Type: application/json\r\n"),  # guard: 421
        (b"/nowhere", b"127.0.0.1", b"Content-Type: application/json\r\n"),  # router: 404
        (b"/schedules", b"127.0.0.1", b"Content-Type: application/json\r\n"),  # a route reads it
    ]
    with Server(database, "api", PM_LOG_LEVEL="INFO", PM_API_TOKEN="") as server:
        log = Path(server.log.name)
        for path, host, headers in cases:
            answer = _raw_answer(server.base, head % (path, host, headers) + body)
            assert answer.startswith(b"HTTP/1.1 400 "), answer[:300]
            assert b"Invalid HTTP request" in answer and b"Traceback" not in answer
        with httpx.Client(base_url=server.base, timeout=10) as c:  # and the server is fine
            assert c.get("/schedules").status_code == 200
        deadline = time.monotonic() + 10
        while log.read_text().count("Invalid HTTP request received") < len(cases):
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        # An error logged after an answer would come while the server goes on: one more request,
        # served after all of them, and its access line, mark where the log is complete.
        marker = f"/healthz?after={uuid.uuid4().hex}"
        with httpx.Client(base_url=server.base, timeout=10) as c:
            assert c.get(marker).status_code == 200
        while marker not in log.read_text():
            assert time.monotonic() < deadline + 10, log.read_text()[-3000:]
            time.sleep(0.05)
        text = log.read_text()
    assert "Traceback" not in text and "unhandled error" not in text, text[-6000:]
    assert "Exception in ASGI" not in text and "ERROR" not in text, text[-6000:]
    # One warning line per request (plus uvicorn's access line when the app had started one).
    assert text.count("Invalid HTTP request received") == len(cases)


async def test_an_answer_refused_on_an_open_connection_is_still_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The quiet path above needs the server to report the connection closed: a send that fails
    while the connection stays open is some other fault, and is raised as before."""
    monkeypatch.setattr(unsent, "DISCONNECT_WAIT_S", 0.2)
    answer = PlainTextResponse("hello")
    app = unsent.UnsentAnswers(answer)
    scope = {"type": "http", "method": "GET", "path": "/x", "headers": []}
    later = asyncio.Event()

    async def open_receive() -> dict[str, Any]:
        await later.wait()  # never: the connection stays open
        return {"type": "http.disconnect"}

    async def refusing_send(message: dict[str, Any]) -> None:
        raise RuntimeError("the server refused it")

    with pytest.raises(RuntimeError, match="the server refused it"):
        await app(scope, open_receive, refusing_send)

    async def closed_receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    await app(scope, closed_receive, refusing_send)  # closed: the client has its answer
