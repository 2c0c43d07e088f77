"""Shared fixtures: fresh PostgreSQL and MariaDB/MySQL databases, SQLite files and Redis key
prefixes per test.

Tests talk to real services (PM_TEST_PG_DSN, PM_TEST_MYSQL_URL, PM_TEST_REDIS_URL; defaults: the
local ones). A service that cannot be reached skips its tests locally, and fails them under CI=true.

**Redis.** The tests use a database of their own, 15 by default (``redis://127.0.0.1:6379/15``),
so whatever they write never lands among the keys of a local app in database 0; each
pytest-xdist worker has its own, counting down from it (gw1 uses 14). Every key a test
writes contains its :func:`redis_prefix`: ``pmt``, a marker of this run, then the test's own
part. After each test its keys are deleted, and :func:`no_stray_redis_keys` fails the run if it
leaves any key behind: one of this run's, or one without any run's marker (a default prefix such
as ``pm:``, kombu's ``_kombu.*``, ``celery``, ``unacked*``, arq's ``arq:*``). Keys of other runs
sharing the Redis (they carry their own marker) and keys older than the run are left alone, so
runs in parallel do not fail each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import logging
import os
import re
import shutil
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
import redis
import redis.asyncio as aioredis
from sqlalchemy.engine import make_url

from periodic_manager.db.engine import normalize_url
from periodic_manager.db.migrate import upgrade

if TYPE_CHECKING:
    from tests.support.tcpproxy import TcpProxy

PG_DSN = os.environ.get("PM_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432")
# A MariaDB or MySQL server, as a URL without a database (root may create and drop databases).
MYSQL_URL = os.environ.get("PM_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306")
BASE_REDIS_URL = os.environ.get("PM_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
AMQP_URL = os.environ.get("PM_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
IN_CI = os.environ.get("CI", "").lower() == "true"
RUN_MARKER = f"pmt{uuid.uuid4().hex[:4]}"  # in every Redis key this run's tests write
ANY_RUN = re.compile(r"pmt[0-9a-f]{10}")  # a test prefix of any run (this one or another)


def _redis_db_url(index: int) -> str:
    """The Redis database of xdist worker ``index`` (0 without workers): the base database of
    ``PM_TEST_REDIS_URL``, 15 by default, less the index (worker gw1 uses 14), so that no two
    workers of a run share a database and none of them lands in database 0."""
    parts = urlsplit(BASE_REDIS_URL)
    base = int(parts.path.strip("/") or 0)
    if index and base - index < 1:
        raise pytest.UsageError(
            f"{index + 1} pytest-xdist workers need Redis databases {base} down to"
            f" {base - index}, above 0: set PM_TEST_REDIS_URL to a higher database"
        )
    return urlunsplit(parts._replace(path=f"/{base - index}"))


def _worker_index() -> int:
    """This process's xdist worker number (gw2 -> 2), 0 without workers."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) if worker.startswith("gw") else 0


# The Redis database this process's tests write to (every worker has its own).
REDIS_URL = _redis_db_url(_worker_index())


def _unavailable(what: str, exc: BaseException) -> None:
    msg = f"{what} unreachable: {exc!r}"
    if IN_CI:
        pytest.fail(msg + " (CI=true: a missing service is a failure)", pytrace=False)
    pytest.skip(msg)


def _pg_url(name: str) -> str:
    return f"{PG_DSN.replace('postgresql://', 'postgresql+asyncpg://')}/{name}"


@contextlib.asynccontextmanager
async def new_pg_database(*, migrated: bool = False) -> AsyncIterator[str]:
    """A new PostgreSQL database (its asyncpg URL), dropped on the way out: empty, or with
    ``migrated`` a copy of this process's migrated template (:func:`_templates`)."""
    name = f"pm_test_{uuid.uuid4().hex[:12]}"
    try:
        admin = await asyncpg.connect(f"{PG_DSN}/postgres", timeout=5)
    except (OSError, asyncpg.PostgresError) as exc:
        _unavailable("PostgreSQL", exc)
    try:
        template = f' TEMPLATE "{await _templates.pg(admin)}"' if migrated else ""
        await admin.execute(f'CREATE DATABASE "{name}"{template}')
        yield _pg_url(name)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    """URL of a new, empty PostgreSQL database, dropped after the test."""
    async with new_pg_database() as url:
        yield url


def _mysql_url(name: str) -> str:
    return normalize_url(
        make_url(MYSQL_URL).set(database=name).render_as_string(hide_password=False)
    )


async def _mysql_admin() -> Any:
    import asyncmy

    u = make_url(MYSQL_URL)
    try:
        return await asyncmy.connect(
            host=u.host or "127.0.0.1",
            port=u.port or 3306,
            user=u.username or "root",
            password=u.password or "",
            connect_timeout=5,
        )
    except (OSError, asyncmy.errors.Error) as exc:
        _unavailable("MariaDB/MySQL", exc)


@contextlib.asynccontextmanager
async def new_mysql_database(*, migrated: bool = False) -> AsyncIterator[str]:
    """A new MariaDB/MySQL database (its asyncmy URL), dropped on the way out: empty, or with
    ``migrated`` a copy of this process's migrated template (:func:`_templates`)."""
    name = f"pm_test_{uuid.uuid4().hex[:12]}"
    admin = await _mysql_admin()
    try:
        async with admin.cursor() as cur:
            await cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        if migrated:
            await _templates.mysql_copy(admin, name)
        yield _mysql_url(name)
    finally:
        async with admin.cursor() as cur:
            await cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        admin.close()


@pytest.fixture
async def mariadb_url() -> AsyncIterator[str]:
    """URL of a new, empty MariaDB/MySQL database, dropped after the test."""
    async with new_mysql_database() as url:
        yield url


@pytest.fixture
async def proxied(pg_url: str) -> AsyncIterator[tuple[str, TcpProxy]]:
    """``pg_url``'s database through a TcpProxy the test can cut or freeze: its URL, the proxy."""
    # Imported here: this file stands alone (tests/support/test_redis_hygiene.py runs a copy).
    from tests.support.tcpproxy import TcpProxy

    u = make_url(pg_url)
    proxy = TcpProxy(u.host or "127.0.0.1", u.port or 5432)
    port = await proxy.start()
    try:
        yield u.set(port=port).render_as_string(hide_password=False), proxy
    finally:
        await proxy.close()


@pytest.fixture
def sqlite_url(tmp_path: object) -> str:
    return f"sqlite+aiosqlite:///{tmp_path}/pm.db"  # type: ignore[str-bytes-safe]


@pytest.fixture
async def migrated_pg_url() -> AsyncIterator[str]:
    """URL of a new PostgreSQL database migrated to head (a copy of the template)."""
    async with new_pg_database(migrated=True) as url:
        yield url


@pytest.fixture
async def migrated_mariadb_url() -> AsyncIterator[str]:
    """URL of a new MariaDB/MySQL database migrated to head (a copy of the template)."""
    async with new_mysql_database(migrated=True) as url:
        yield url


@pytest.fixture
async def migrated_sqlite_url(tmp_path: Path) -> str:
    """URL of a new SQLite file migrated to head (a copy of the template's file)."""
    shutil.copyfile(await _templates.sqlite(), tmp_path / "pm.db")
    return f"sqlite+aiosqlite:///{tmp_path}/pm.db"


# The URL fixture of each backend the per-backend tests run on: an empty database, and one
# migrated to head.
BACKEND_URLS = {"postgresql": "pg_url", "sqlite": "sqlite_url", "mysql": "mariadb_url"}
MIGRATED_URLS = {
    "postgresql": "migrated_pg_url",
    "sqlite": "migrated_sqlite_url",
    "mysql": "migrated_mariadb_url",
}


def backend_url(request: pytest.FixtureRequest, backend: str, *, migrated: bool = False) -> str:
    """A new database of ``backend`` (its URL fixture's value): empty, or migrated to head."""
    return str(request.getfixturevalue((MIGRATED_URLS if migrated else BACKEND_URLS)[backend]))


class _Templates:
    """This process's databases migrated to head once, which the ``migrated_*`` fixtures copy:
    running the migrations takes about 2 s a database (PostgreSQL, MariaDB), a copy a tenth of
    that. PostgreSQL copies its template itself (``CREATE DATABASE ... TEMPLATE``); MariaDB has
    no templates, so the template's tables (as ``SHOW CREATE TABLE`` writes them), their rows
    (the migrations' own: the Alembic revision, counters) and then its triggers are made again;
    SQLite's file is copied. One set per process (an xdist worker has its own), dropped at its
    end. The migrations themselves run on empty databases (tests/db/test_migrations.py)."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self._mysql_script: list[str] | None = None
        self._dir: Path | None = None

    async def pg(self, admin: asyncpg.Connection) -> str:
        if "postgresql" not in self.names:
            name = f"pm_test_tpl_{uuid.uuid4().hex[:8]}"
            await admin.execute(f'CREATE DATABASE "{name}"')
            self.names["postgresql"] = name  # dropped at the end even if the upgrade fails
            await upgrade(_pg_url(name))
        return self.names["postgresql"]

    async def sqlite(self) -> Path:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="pm-test-tpl-"))
            await upgrade(f"sqlite+aiosqlite:///{self._dir}/pm.db")
        return self._dir / "pm.db"

    async def mysql_copy(self, admin: Any, name: str) -> None:
        script = await self._mysql(admin)
        async with admin.cursor() as cur:
            await cur.execute(f"USE `{name}`")
            for statement in script:
                await cur.execute(statement)
            await cur.execute("USE mysql")

    async def _mysql(self, admin: Any) -> list[str]:
        """The statements that make the template again in the current database."""
        if self._mysql_script is not None:
            return self._mysql_script
        name = f"pm_test_tpl_{uuid.uuid4().hex[:8]}"
        async with admin.cursor() as cur:
            await cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
            self.names["mysql"] = name
            await upgrade(_mysql_url(name))
            script = ["SET @pm_fk = @@foreign_key_checks, foreign_key_checks = 0"]
            await cur.execute(
                "SELECT table_name FROM information_schema.tables"
                " WHERE table_schema = %s AND table_type = 'BASE TABLE' ORDER BY table_name",
                (name,),
            )
            tables = [row[0] for row in await cur.fetchall()]
            for table in tables:
                await cur.execute(f"SHOW CREATE TABLE `{name}`.`{table}`")
                script.append((await cur.fetchone())[1])
            for table in tables:
                await cur.execute(f"SELECT COUNT(*) FROM `{name}`.`{table}`")
                if (await cur.fetchone())[0] == 0:
                    continue
                await cur.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_schema = %s"
                    " AND table_name = %s AND extra NOT LIKE '%%GENERATED%%' ORDER BY ordinal_position",
                    (name, table),
                )
                columns = ", ".join(f"`{row[0]}`" for row in await cur.fetchall())
                script.append(
                    f"INSERT INTO `{table}` ({columns}) SELECT {columns} FROM `{name}`.`{table}`"
                )
            await cur.execute(
                "SELECT trigger_name FROM information_schema.triggers WHERE trigger_schema = %s"
                " ORDER BY event_object_table, action_order",
                (name,),
            )
            for (trigger,) in await cur.fetchall():
                await cur.execute(f"SHOW CREATE TRIGGER `{name}`.`{trigger}`")
                _, sql_mode, statement, *_ = await cur.fetchone()
                script += [f"SET SESSION sql_mode = '{sql_mode}'", statement]
            script += ["SET SESSION sql_mode = DEFAULT", "SET foreign_key_checks = @pm_fk"]
        self._mysql_script = script
        return script

    async def drop(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        if "postgresql" in self.names:
            admin = await asyncpg.connect(f"{PG_DSN}/postgres", timeout=5)
            try:
                await admin.execute(
                    f'DROP DATABASE IF EXISTS "{self.names["postgresql"]}" WITH (FORCE)'
                )
            finally:
                await admin.close()
        if "mysql" in self.names:
            admin = await _mysql_admin()
            try:
                async with admin.cursor() as cur:
                    await cur.execute(f"DROP DATABASE IF EXISTS `{self.names['mysql']}`")
            finally:
                admin.close()


_templates = _Templates()


@pytest.fixture(params=list(BACKEND_URLS))
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["postgresql", "mysql"])
def server_url(request: pytest.FixtureRequest) -> str:
    """A new, empty database on each database server (PostgreSQL, MariaDB/MySQL): for what
    SQLite cannot do (several processes writing at once, row locks)."""
    return backend_url(request, request.param)


@pytest.fixture
def empty_db_url(backend: str, request: pytest.FixtureRequest) -> str:
    """An empty database on each backend (the test is run once per backend)."""
    return backend_url(request, backend)


@pytest.fixture
def db_url(backend: str, request: pytest.FixtureRequest) -> str:
    """A database migrated to head, on each backend (a copy of the migrated template)."""
    return backend_url(request, backend, migrated=True)


@pytest.fixture(autouse=True)
def cli_logging_undone() -> Iterator[None]:
    """A test that runs the CLI in its process (``main([...])``) has it configure logging: a
    handler on the root logger writing to ``sys.stderr`` as it was then, the test's captured
    stream, which pytest closes after the test. Left there, it made every later log line of the
    process print "--- Logging error --- ... I/O operation on closed file". Undone after each
    test (the handler, the root's level, alembic's level)."""
    from periodic_manager.cli import logs

    root, alembic = logging.getLogger(), logging.getLogger("alembic")
    levels = root.level, alembic.level
    yield
    for handler in [h for h in root.handlers if h.get_name() == logs._HANDLER]:
        root.removeHandler(handler)
    root.setLevel(levels[0])
    alembic.setLevel(levels[1])


DUMP_BEFORE_TIMEOUT_S = 5.0  # the tasks' stacks are printed this long before pytest-timeout


@pytest.fixture
async def tasks_dumped_on_timeout(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """An async test that hangs shows where its tasks wait: shortly before pytest-timeout ends
    it, every task of its loop prints its stack (pytest-timeout prints only the threads', and
    a hung test's main thread just waits in the selector). Added to every coroutine test by
    :func:`pytest_collection_modifyitems`; a watchdog on the loop, it waits for no slot."""
    marker = request.node.get_closest_marker("timeout")
    limit = float(
        marker.args[0] if marker and marker.args else request.config.getini("timeout") or 0
    )
    if limit <= 2 * DUMP_BEFORE_TIMEOUT_S:
        yield
        return
    handle = asyncio.get_running_loop().call_later(limit - DUMP_BEFORE_TIMEOUT_S, _print_tasks)
    try:
        yield
    finally:
        handle.cancel()


def _print_tasks() -> None:
    tasks = asyncio.all_tasks()
    print(f"\n{'~' * 20} {len(tasks)} asyncio task(s), shortly before the timeout {'~' * 20}")
    for task in sorted(tasks, key=lambda t: t.get_name()):
        print(f"{task.get_name()}: {task.get_coro()!r}")
        # The whole chain of awaits (a task's own stack holds only its outermost frame).
        link: Any = task.get_coro()
        for _ in range(40):
            frame = getattr(link, "cr_frame", None) or getattr(link, "gi_frame", None)
            if frame is None:
                break
            print(f"    {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
            link = getattr(link, "cr_await", None) or getattr(link, "gi_yieldfrom", None)
        if link is not None:
            print(f"    awaiting {link!r}"[:300])


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if isinstance(item, pytest.Function) and inspect.iscoroutinefunction(item.function):
            item.fixturenames.append("tasks_dumped_on_timeout")
    _group_for_workers(config, items)


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A key prefix unique to the test; every key the test makes contains it, and every key
    that contains it is deleted after the test (whoever wrote it: the test, a worker, a manager)."""
    prefix = f"{RUN_MARKER}{uuid.uuid4().hex[:6]}"
    yield prefix
    client = _sync_redis()
    if client is None:  # the tests that needed Redis were skipped or failed already
        return
    with client:
        keys = list(client.scan_iter(match=f"*{prefix}*", count=1000))
        for start in range(0, len(keys), 1000):
            client.delete(*keys[start : start + 1000])


@pytest.fixture
async def redis_client(redis_prefix: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(REDIS_URL, decode_responses=True)
    try:
        await client.ping()
    except (OSError, aioredis.RedisError) as exc:
        await client.aclose()
        _unavailable("Redis", exc)
    try:
        yield client
    finally:
        await client.aclose()  # the keys go with redis_prefix


@pytest.fixture
def redis_url() -> Iterator[str]:
    yield REDIS_URL


def amqp_address() -> tuple[str, int]:
    """Host and port of the test RabbitMQ (``PM_TEST_AMQP_URL``)."""
    parts = urlsplit(AMQP_URL)
    return parts.hostname or "127.0.0.1", parts.port or 5672


def amqp_through(port: int) -> str:
    """``PM_TEST_AMQP_URL`` with its host and port replaced by a local proxy's."""
    parts = urlsplit(AMQP_URL)
    auth = parts.netloc.rpartition("@")[0]
    return urlunsplit(
        parts._replace(netloc=f"{auth}@127.0.0.1:{port}" if auth else f"127.0.0.1:{port}")
    )


@pytest.fixture
def amqp_url() -> str:
    """The test RabbitMQ's URL, once it answers on its port (else skipped; a failure under CI)."""
    try:
        socket.create_connection(amqp_address(), timeout=3).close()
    except OSError as exc:
        _unavailable("RabbitMQ", exc)
    return AMQP_URL


def _sync_redis(url: str = "") -> redis.Redis | None:
    """A client of the test Redis (``url``, this process's database by default), or None when
    it does not answer."""
    client = redis.Redis.from_url(url or REDIS_URL, socket_connect_timeout=2, socket_timeout=30)
    try:
        client.ping()
    except (OSError, redis.RedisError):
        client.close()
        return None
    return client


def _snapshot(urls: list[str]) -> set[tuple[str, bytes]] | None:
    """Every key of the test Redis databases ``urls`` now, with its database's URL, or None when
    the Redis does not answer."""
    keys: set[tuple[str, bytes]] = set()
    for url in urls:
        client = _sync_redis(url)
        if client is None:
            return None
        with client:
            keys.update((url, key) for key in client.scan_iter(count=1000))
    return keys


def _stray(before: set[tuple[str, bytes]], urls: list[str]) -> str | None:
    """What is wrong with the keys present now but not ``before`` that are this run's or carry no
    run's marker (None when there are none, or the Redis does not answer)."""
    after = _snapshot(urls)
    if after is None:
        return None
    stray = sorted(
        (key.decode(errors="replace"), url)
        for url, key in after - before
        if RUN_MARKER.encode() in key or not ANY_RUN.search(key.decode(errors="replace"))
    )
    if not stray:
        return None
    shown = ", ".join(key for key, _ in stray[:30])
    shown += f" ... ({len(stray)} in all)" if len(stray) > 30 else ""
    where = ", ".join(sorted({url for _, url in stray}))
    return (
        f"the tests left {len(stray)} key(s) in the test Redis ({where}): {shown}. "
        "A test must write only keys containing its redis_prefix (and delete what it writes)."
    )


# -- pytest-xdist: the suite runs on workers by default, a file or the process group on each --

WORKERS = 3  # the default number of pytest-xdist workers (measured in docs/development.md)

# Files whose tests start real processes or servers (managers, brokers' workers, private Redis
# and PostgreSQL servers, libfaketime) and hold bounds on real time derived from the product's
# settings (a takeover within leader_timeout + poll, a stop within its grace): they run one at a
# time, on one worker, beside the other files, so that two of them never share the two cores.
# Their group starts first: it is the longest.
PROCESS_FILES = frozenset(
    f"tests/behaviour/{name}.py"
    for name in (
        "test_broker_forgets",
        "test_celery_faults",
        "test_clock_faults",
        "test_examples",
        "test_faults",
        "test_loop_death",
        "test_lost_replies",
        "test_partition_moves",
        "test_partition_processes",
        "test_sick_manager",
        "test_worker_processes",
    )
) | {"tests/deploy/test_containers.py"}  # podman builds and runs the image and the compose stack
PROCESS_GROUP = "processes"


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which sets the workers up
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Without ``-n`` the suite runs on :data:`WORKERS` xdist workers; with ``-n N`` on N. Each
    worker takes one file (or the process group) at a time (``--dist loadfile``, unless another
    ``--dist`` is given: see :func:`pytest_xdist_make_scheduler`); ``-n 0`` or ``-p no:xdist``
    runs the suite in one process."""
    option = config.option
    if _is_worker(config) or not hasattr(option, "numprocesses"):
        return  # xdist is off (-p no:xdist)
    if option.numprocesses is None and not (option.usepdb or option.collectonly):
        option.numprocesses = WORKERS
    if option.numprocesses and option.dist == "no":
        option.dist = "loadfile"


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent under -p no:xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadfile``: a file's tests go to one worker, one file at a time, and the
    files of :data:`PROCESS_FILES` are one scope (:data:`PROCESS_GROUP`), so two of them never
    run at once. The controller decides it from the node ids alone (a worker parses the command
    line again and never sees a ``--dist`` set by :func:`pytest_cmdline_main`)."""
    if config.option.dist != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FilesAndProcesses(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return PROCESS_GROUP if path in PROCESS_FILES else path

    return FilesAndProcesses(config, log)


def _group_for_workers(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files of :data:`PROCESS_FILES` first (their scope is the longest, so it is handed
    out first); every worker orders the items alike, as xdist asks."""
    if _is_worker(config):
        items.sort(key=lambda item: item.nodeid.split("::", 1)[0] not in PROCESS_FILES)


# -- pytest-xdist: the workers of one run share its marker, and the controller checks the keys --


def _marker_of(testrunuid: str) -> str:
    return f"pmt{hashlib.sha256(testrunuid.encode()).hexdigest()[:4]}"


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _is_controller(config: pytest.Config) -> bool:
    """The process that hands the tests out to xdist workers (and runs none itself)."""
    return config.pluginmanager.has_plugin("dsession")


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist every worker makes RUN_MARKER from the run's id (``--testrunuid``, which the
    controller sets when it is not given), so the whole run writes one marker."""
    global RUN_MARKER
    config.addinivalue_line(
        "markers", 'containers: builds and runs the image with podman (-m "not containers" skips)'
    )
    if _is_worker(config):
        RUN_MARKER = _marker_of(config.workerinput["testrunuid"])  # type: ignore[attr-defined]
    elif hasattr(config.option, "testrunuid"):  # xdist is installed: this may be a controller
        config.option.testrunuid = config.option.testrunuid or uuid.uuid4().hex
        RUN_MARKER = _marker_of(config.option.testrunuid)


_KEYS_BEFORE = pytest.StashKey[set[tuple[str, bytes]]]()


def _workers_redis(config: pytest.Config) -> list[str]:
    """The Redis databases of the controller's workers, one each (:func:`_redis_db_url`)."""
    return [_redis_db_url(index) for index in range(len(config.option.tx))]


@pytest.hookimpl(tryfirst=True)  # before the workers start
def pytest_sessionstart(session: pytest.Session) -> None:
    if _is_controller(session.config):
        before = _snapshot(_workers_redis(session.config))
        if before is not None:
            session.config.stash[_KEYS_BEFORE] = before


def pytest_sessionfinish(session: pytest.Session) -> None:
    """This process's template databases are dropped. Then the controller's check, once every
    worker has finished: reported as an error of :func:`no_stray_redis_keys`, as a run without
    workers reports it."""
    if _templates.names or _templates._dir is not None:
        asyncio.run(_templates.drop())
    before = session.config.stash.get(_KEYS_BEFORE, None)
    problem = None if before is None else _stray(before, _workers_redis(session.config))
    if problem is None:
        return
    report = pytest.TestReport(
        nodeid="tests/conftest.py::no_stray_redis_keys",
        location=("tests/conftest.py", 0, "no_stray_redis_keys"),
        keywords={},
        outcome="failed",
        longrepr=problem,
        when="teardown",
    )
    session.config.hook.pytest_runtest_logreport(report=report)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session", autouse=True)
def no_stray_redis_keys(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the run when it leaves keys in the test Redis (see the module docstring): the keys
    present at the end but not at the start that are this run's or carry no run's marker. Under
    pytest-xdist a worker cannot tell (the others are still writing): the controller checks."""
    before = None if _is_worker(request.config) else _snapshot([REDIS_URL])
    yield
    problem = None if before is None else _stray(before, [REDIS_URL])
    if problem is not None:
        pytest.fail(problem, pytrace=False)
