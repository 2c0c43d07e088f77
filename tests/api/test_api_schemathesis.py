"""Property-based fuzzing of the API against its own OpenAPI document (schemathesis).

The app runs in a real uvicorn server on a free port (its lifespan opens the engine), on a
migrated SQLite file seeded with a few schedules so that id lookups hit rows too. Every generated
request (valid and invalid data) must get no 5xx, a documented status code, the documented
media type, and a body matching the documented schema. At least 1,000 cases run in total.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from periodic_manager.api import create_app
from periodic_manager.db.migrate import upgrade_sync
from periodic_manager.settings import Settings
from tests.support.servers import free_port

EXAMPLES_PER_OPERATION = 45  # per operation and mode (valid, invalid data)
MIN_CASES = 1000
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
cases_run: list[str] = []


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Any]]]:
    db = Path(tmp_path_factory.mktemp("fuzz")) / "pm.db"
    url = f"sqlite+aiosqlite:///{db}"
    upgrade_sync(url)
    app = create_app(Settings(database_url=url, target="outbox"))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, name="fuzzed-api", daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            if server.started:
                break
            time.sleep(0.05)
        assert server.started, "the API did not start"
        with httpx.Client(base_url=base) as client:
            for i, spec in enumerate(["* * * * *", "@every 90s", "0 6 * * *"]):
                body = {"name": f"seed.{i}", "spec": spec, "task_type": "t"}
                assert client.post("/schedules", json=body).status_code == 201
            document = client.get("/openapi.json").json()
        yield base, document
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def api_schema(served: tuple[str, dict[str, Any]]) -> Any:
    _, document = served
    return schemathesis.openapi.from_dict(document)


@pytest.fixture(scope="module")
def base_url(served: tuple[str, dict[str, Any]]) -> str:
    return served[0]


SETTINGS = settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def test_api_conforms_to_its_schema(api_schema: Any, base_url: str) -> None:
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 15
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                strategy = operation.as_strategy(generation_mode=mode)
            except Exception:  # no negative variant (an operation without parameters)
                continue

            @SETTINGS
            @given(case=strategy)
            def check(case: Any) -> None:
                cases_run.append(case.operation.label)
                case.call_and_validate(base_url=base_url, checks=CHECKS)

            try:
                check()
            except Unsatisfiable:
                # Nothing can be made invalid (no parameters, no body): only for negative data.
                assert mode is GenerationMode.NEGATIVE, operation.label


def test_enough_cases_ran() -> None:
    if not cases_run:
        pytest.skip("the fuzz test did not run (deselected)")
    assert len(cases_run) >= MIN_CASES, f"only {len(cases_run)} generated cases ran"
    print(f"schemathesis: {len(cases_run)} cases over {len(set(cases_run))} operations")
