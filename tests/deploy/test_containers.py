"""The image and the compose stack, built and run here with podman (docs/deploy.md).

The image is built once for the file from ``Containerfile`` and run against this machine's
PostgreSQL and Redis (``--network host``); the compose stack (``compose.yaml`` with
``deploy/compose.test.yaml``, whose database images are built here from the local Debian base) is
brought up, a schedule created over its API fires, and it is brought down, volumes and network
included, whatever happened. Marked ``containers``: ``-m "not containers"`` skips them locally;
under ``CI=true`` a missing tool fails them.
"""

from __future__ import annotations

import json
import re
import time
import tomllib
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import httpx
import pytest
import redis.asyncio as aioredis

from tests.deploy import containers
from tests.deploy.containers import IMAGE, run
from tests.support import ROOT
from tests.support.polling import eventually
from tests.support.servers import free_port

pytestmark = [pytest.mark.containers, pytest.mark.timeout(900)]

MAX_IMAGE_BYTES = 200_000_000
MAX_START_S = 3.0  # `podman run` to the manager's "started" line
MAX_COMPOSE_FIRE_S = 60.0  # `podman-compose up` to the first slot enqueued
STARTED = re.compile(r"^(\S+ \S+) INFO \S+: manager \S+ started with", re.M)
TOKEN = "image-test-token"


@pytest.fixture(scope="module")
def image() -> str:
    containers.require_tools()
    containers.ensure_base()
    started = time.monotonic()
    # The test database images (built once per machine) meanwhile: both builds mostly wait on
    # Debian's mirror and PyPI.
    with ThreadPoolExecutor(1) as pool:
        test_images = pool.submit(containers.ensure_test_images)
        containers.build_image()
        test_images.result()
    print(f"\nimages built in {time.monotonic() - started:.1f} s")
    return IMAGE


def inspect(ref: str, kind: str = "image") -> dict:
    return json.loads(run("podman", kind, "inspect", ref).stdout)[0]


def test_the_image_is_small_labelled_and_runs_as_a_user(image: str) -> None:
    info = inspect(image)
    config = info["Config"]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    print(f"image size {info['Size'] / 1e6:.1f} MB")
    assert info["Size"] <= MAX_IMAGE_BYTES, f"{info['Size'] / 1e6:.1f} MB"
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == version
    assert labels["org.opencontainers.image.licenses"] == "MIT"
    assert "org.opencontainers.image.source" in labels
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["periodic-manager"] and config["Cmd"] == ["run"]
    assert "8000/tcp" in config["ExposedPorts"]
    assert {"PM_HOST=0.0.0.0", "PM_PORT=8000"} <= set(config["Env"])
    assert "periodic-manager health" in " ".join(info["Healthcheck"]["Test"])  # docker format
    assert run("podman", "run", "--rm", image, "--version").stdout.strip().endswith(version)


@pytest.fixture
def container_name() -> Iterator[str]:
    name = f"pm-test-{uuid.uuid4().hex[:8]}"
    yield name
    run("podman", "rm", "-f", "-t", "0", name, check=False)


def _started_after(logs: str, since: float) -> float | None:
    """Seconds from ``since`` (a wall-clock time) to the manager's "started" line, if logged."""
    found = STARTED.search(logs)
    if found is None:
        return None
    # The image sets no zone: its log times are UTC.
    at = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC)
    return at.timestamp() - since


async def test_the_image_migrates_runs_fires_is_healthy_and_stops_on_sigterm(
    image: str,
    pg_url: str,
    redis_url: str,
    redis_prefix: str,
    redis_client: aioredis.Redis,
    container_name: str,
) -> None:
    database = {"PM_DATABASE_URL": pg_url}
    migrate = run("podman", "run", "--rm", "--network", "host", "-e", f"PM_DATABASE_URL={pg_url}",
                  image, "migrate")  # fmt: skip
    assert "schema at head" in migrate.stderr
    port = free_port()
    settings = {
        **database,
        "PM_HOST": "127.0.0.1",  # the host's network: loopback only
        "PM_PORT": str(port),
        "PM_API_TOKEN": TOKEN,
        "PM_TARGET": "redis",
        "PM_REDIS_URL": redis_url,
        "PM_STREAM_PREFIX": redis_prefix,
    }
    flags = [f"--env={k}={v}" for k, v in settings.items()]

    def logs() -> str:
        return run("podman", "logs", container_name, check=False).stderr

    since = time.time()
    run("podman", "run", "-d", "--name", container_name, "--network", "host", *flags, image)
    await eventually(lambda: STARTED.search(logs()) is not None, "started", seconds=30,
                     interval=0.1, detail=logs)  # fmt: skip
    took = _started_after(logs(), since)
    print(f"podman run to started: {took:.2f} s")
    assert took is not None and took <= MAX_START_S, logs()
    assert run("podman", "exec", container_name, "id", "-u").stdout.strip() == "10001"

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        assert (await client.get("/schedules")).status_code == 401
        auth = {"Authorization": f"Bearer {TOKEN}"}
        body = {"name": "image.tick", "spec": "@every 1s", "task_type": "image.tick"}
        created = await client.post("/schedules", json=body, headers=auth)
        assert created.status_code == 201, created.text
        runs = f"/schedules/{created.json()['id']}/runs"

        async def fired() -> bool:
            items = (await client.get(runs, headers=auth)).json()["items"]
            return any(item["status"] == "enqueued" for item in items)

        await eventually(fired, "a slot enqueued", seconds=20, interval=0.2, detail=logs)
    # ... into the host's Redis, on the stream of the default queue
    assert await redis_client.xlen(f"{{{redis_prefix}:default}}:stream") >= 1
    health = run("podman", "healthcheck", "run", container_name, check=False)
    assert health.returncode == 0, f"{health.stdout}{health.stderr}"

    run("podman", "kill", "--signal", "TERM", container_name)
    status = run("podman", "wait", container_name, timeout=30).stdout.strip()
    assert status == "0", logs()
    assert "Finished server process" in logs()


def test_health_without_a_probe_file_is_unhealthy(image: str) -> None:
    checked = run("podman", "run", "--rm", image, "health", check=False)
    assert checked.returncode == 1 and "manager.json" in checked.stderr, checked.stderr


@pytest.fixture
def stack(image: str) -> Iterator[tuple[str, dict[str, str]]]:
    """compose.yaml with deploy/compose.test.yaml, as a project of its own: its name and the
    environment of podman-compose. Brought down afterwards (containers, volumes, network) even
    when the test failed."""
    project = f"pmtest{uuid.uuid4().hex[:8]}"
    compose_env = {
        "API_PORT": str(free_port()),
        "PERIODIC_MANAGER_IMAGE": image,
        # compose.yaml requires it before the override is merged (podman-compose 1.0.3); the
        # override's literal is the token in effect.
        "PM_API_TOKEN": "not-the-token",
    }
    try:
        yield project, compose_env
    finally:
        run(*compose(project), "down", "-v", "-t", "5", timeout=180, check=False,
            extra_env=compose_env)  # fmt: skip
        label = f"label=io.podman.compose.project={project}"
        left = run("podman", "ps", "-aq", "--filter", label, check=False).stdout.split()
        if left:
            run("podman", "rm", "-f", "-t", "0", *left, check=False)
        for volume in ("postgres", "redis"):
            run("podman", "volume", "rm", "-f", f"{project}_{volume}", check=False)
        run("podman", "network", "rm", "-f", f"{project}_default", check=False)


def compose(project: str) -> list[str]:
    return ["podman-compose", "-p", project, "-f", "compose.yaml", "-f", "deploy/compose.test.yaml"]


async def test_compose_up_serves_the_dashboard_and_fires_a_schedule_within_a_minute(
    stack: tuple[str, dict[str, str]],
) -> None:
    project, compose_env = stack
    base = f"http://127.0.0.1:{compose_env['API_PORT']}"

    def logs() -> str:
        return "\n".join(
            run("podman", "logs", "--tail", "15", f"{project}_{name}_1", check=False).stderr
            for name in ("migrate", "api", "manager-1", "manager-2")
        )

    started = time.monotonic()
    run(*compose(project), "up", "-d", timeout=300, extra_env=compose_env)
    up_took = time.monotonic() - started
    auth = {"Authorization": "Bearer compose-test-token"}
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:

        async def ready() -> bool:
            try:
                return (await client.get("/readyz")).status_code == 200
            except httpx.TransportError:
                return False

        await eventually(ready, "the API ready", seconds=45, interval=0.25, detail=logs)
        ui = await client.get("/ui")
        assert ui.status_code == 200 and "text/html" in ui.headers["content-type"]
        refused = await client.get("/schedules", headers={"Authorization": "Bearer not-the-token"})
        assert refused.status_code == 401
        body = {"name": "compose.tick", "spec": "@every 1s", "task_type": "compose.tick"}
        created = await client.post("/schedules", json=body, headers=auth)
        assert created.status_code == 201, created.text
        runs = f"/schedules/{created.json()['id']}/runs"

        async def fired() -> bool:
            items = (await client.get(runs, headers=auth)).json()["items"]
            return any(item["status"] == "enqueued" for item in items)

        await eventually(fired, "a slot enqueued", seconds=30, interval=0.2, detail=logs)
        fired_after = time.monotonic() - started
        print(f"\ncompose up -d {up_took:.1f} s, first slot enqueued {fired_after:.1f} s after it")
        assert fired_after <= MAX_COMPOSE_FIRE_S
        managers = (await client.get("/managers", headers=auth)).json()["items"]
        assert len(managers) == 2, managers  # the two manager services, sharing the partitions
        assert all(m["partitions"] for m in managers), managers
        partitions = sum(len(m["partitions"]) for m in managers)

        # SIGTERM to one manager: it exits 0 having handed its partitions over, and the other
        # holds them all (what terminationGracePeriodSeconds and TimeoutStopSec must cover).
        stopping = time.monotonic()
        run("podman", "stop", "-t", "30", f"{project}_manager-1_1", timeout=60)
        stop_took = time.monotonic() - stopping
        exit_code = run("podman", "inspect", "--format", "{{.State.ExitCode}}",
                        f"{project}_manager-1_1").stdout.strip()  # fmt: skip
        assert exit_code == "0", logs()

        async def handed_over() -> bool:
            items = (await client.get("/managers", headers=auth)).json()["items"]
            return len(items) == 1 and len(items[0]["partitions"]) == partitions

        await eventually(handed_over, "one manager holding every partition", seconds=30,
                         interval=0.2, detail=logs)  # fmt: skip
        print(f"manager stopped in {stop_took:.1f} s, every partition held "
              f"{time.monotonic() - stopping:.1f} s after the SIGTERM")  # fmt: skip
