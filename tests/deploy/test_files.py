"""The deployment files read as they should without running anything: the Containerfile and its
Docker name, the build context's ignore lists, the compose files (the override appends nothing
podman-compose would append), the CA folder."""

from __future__ import annotations

import re
import subprocess
from typing import Any

import yaml

from periodic_manager.cli.main import _parser
from periodic_manager.settings import Settings
from tests.support import ROOT


def compose(name: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / name).read_text())


def test_the_dockerfile_is_the_containerfile_and_the_ignore_lists_agree() -> None:
    assert (ROOT / "Dockerfile").read_bytes() == (ROOT / "Containerfile").read_bytes()
    assert (ROOT / ".dockerignore").read_bytes() == (ROOT / ".containerignore").read_bytes()


def test_the_image_runs_the_program_as_a_user_with_a_health_check() -> None:
    text = (ROOT / "Containerfile").read_text()
    final = text.rsplit("\nFROM ", 1)[1]  # the stage that ships
    assert re.search(r"^FROM \$\{BASE\} AS build$", text, re.M)
    assert 'ENTRYPOINT ["periodic-manager"]' in final and 'CMD ["run"]' in final
    assert re.search(r"^USER 10001:10001$", final, re.M)
    assert "HEALTHCHECK" in final and "periodic-manager health" in final
    assert "ARG BASE=debian:bookworm-slim" in text


def test_the_ca_folder_exists_with_its_readme_and_no_certificate_is_committed() -> None:
    assert (ROOT / "deploy/ca-certificates/README.md").is_file()
    tracked = subprocess.run(
        ["git", "ls-files", "deploy/ca-certificates"], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    assert [t for t in tracked if t.endswith((".crt", ".pem"))] == []


def test_the_compose_stack_has_its_services_commands_and_settings() -> None:
    services = compose("compose.yaml")["services"]
    assert set(services) == {"postgres", "redis", "migrate", "manager-1", "manager-2", "api"}
    parser = _parser()
    for name in ("migrate", "manager-1", "manager-2", "api"):
        service = services[name]
        parser.parse_args(service["command"])
        for key in service["environment"]:
            assert key.removeprefix("PM_").lower() in Settings.model_fields, (name, key)
    assert services["api"]["ports"] == ["127.0.0.1:${API_PORT:-8000}:8000"]
    assert "PM_API_TOKEN" in services["api"]["environment"]
    assert set(compose("compose.yaml")["volumes"]) == {"postgres", "redis"}


def test_the_test_override_swaps_images_and_sets_the_token_without_appending_lists() -> None:
    services = compose("deploy/compose.test.yaml")["services"]
    for name in ("postgres", "redis"):
        assert services[name] == {"image": services[name]["image"]}
        assert services[name]["image"].startswith("localhost/periodic-manager-test-")
    assert services["api"] == {"environment": {"PM_API_TOKEN": "compose-test-token"}}
