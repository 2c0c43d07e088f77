"""Podman for the container tests: the tools, the images they build once and reuse, and a
command runner that says what failed.

The machine needs podman, runc, podman-compose and (for the local base image) debootstrap;
``.ci/run`` installs them. podman runs with the project's ``deploy/containers.conf`` unless
``CONTAINERS_CONF`` names another. No registry is needed: ``debian:bookworm-slim`` is made
locally when it is missing (``deploy/test-images/base-image.sh``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import _unavailable
from tests.support import ROOT

BASE_IMAGE = "docker.io/library/debian:bookworm-slim"
# The project's image under test: one tag, rebuilt once per run (podman's layer cache keeps the
# steps whose inputs did not change).
IMAGE = "localhost/periodic-manager:test"
# The stand-ins for the official database images, named as deploy/compose.test.yaml names them.
TEST_IMAGES = {
    "localhost/periodic-manager-test-postgres:15": ROOT / "deploy/test-images/postgres",
    "localhost/periodic-manager-test-redis:7": ROOT / "deploy/test-images/redis",
}
RECIPE_LABEL = "org.periodic-manager.test-recipe"
CA_DIR = ROOT / "deploy" / "ca-certificates"
HOST_CAS = Path("/usr/local/share/ca-certificates")
COPIED_CA_PREFIX = "host-test-"  # the CAs a build copies in, and removes, carry this prefix
TOOLS = ("podman", "runc", "podman-compose")


def env() -> dict[str, str]:
    """The environment of podman and podman-compose (no PM_* of the caller's leaks in)."""
    out = {k: v for k, v in os.environ.items() if not k.startswith("PM_")}
    out.setdefault("CONTAINERS_CONF", str(ROOT / "deploy" / "containers.conf"))
    return out


def run(
    *argv: str, timeout: float = 120, check: bool = True, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a command from the repository's root; with ``check`` a non-zero exit fails the test
    with its output."""
    proc = subprocess.run(
        argv,
        cwd=ROOT,
        env={**env(), **(extra_env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


def require_tools() -> None:
    """The container tools, or a skip (a failure under CI=true) naming what is missing."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        _unavailable("container tools", FileNotFoundError(", ".join(missing)))
    probe = run("podman", "info", "--format", "{{.Host.OCIRuntime.Name}}", check=False)
    if probe.returncode != 0:
        _unavailable("podman", RuntimeError(probe.stderr.strip()[-500:]))


def exists(image: str) -> bool:
    return run("podman", "image", "exists", image, check=False).returncode == 0


def ensure_base() -> None:
    """debian:bookworm-slim, made from Debian's mirror once per machine when no registry gave it."""
    if exists(BASE_IMAGE):
        return
    if shutil.which("debootstrap") is None:
        _unavailable("debootstrap", FileNotFoundError("debootstrap"))
    if os.geteuid() != 0:
        _unavailable(f"{BASE_IMAGE} (debootstrap makes it as root only)", PermissionError())
    run("sh", str(ROOT / "deploy/test-images/base-image.sh"), timeout=600)


def _recipe(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            digest.update(path.relative_to(folder).as_posix().encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def ensure_test_images() -> None:
    """The test database images, built once and again only when their recipe changes."""
    for image, folder in TEST_IMAGES.items():
        recipe = _recipe(folder)
        if exists(image):
            label = run("podman", "image", "inspect", "--format", "{{json .Labels}}", image)
            if f'"{RECIPE_LABEL}":"{recipe}"' in label.stdout:
                continue
        run(
            "podman", "build", "--pull=never", "-q", "--label", f"{RECIPE_LABEL}={recipe}",
            "-t", image, str(folder), timeout=600,
        )  # fmt: skip


@contextmanager
def host_cas() -> Iterator[None]:
    """This machine's extra CAs in deploy/ca-certificates/ for the length of a build (pip and apt
    inside it go through the machine's TLS-intercepting egress); removed afterwards, whatever
    happens. A developer's own certificates there are left alone."""
    copied = []
    try:
        for ca in sorted(HOST_CAS.glob("*.crt")) if HOST_CAS.is_dir() else []:
            target = CA_DIR / f"{COPIED_CA_PREFIX}{ca.name}"
            shutil.copyfile(ca, target)
            copied.append(target)
        yield
    finally:
        for target in copied:
            target.unlink(missing_ok=True)


def _image_id(image: str) -> str:
    return run(
        "podman", "image", "inspect", "--format", "{{.Id}}", image, check=False
    ).stdout.strip()


def build_image() -> None:
    """The project's image from the Containerfile (Docker's format keeps the HEALTHCHECK), and its
    build stage under a tag of its own (the cache of the next build); the images they replace
    under the same tags are removed, so that runs do not pile up untagged images."""
    tags = {IMAGE: [], f"{IMAGE}-build": ["--target", "build"]}
    before = {tag: _image_id(tag) for tag in tags}
    with host_cas():
        for tag, target in tags.items():
            run(
                "podman", "build", "--pull=never", "--format", "docker", *target,
                "-f", "Containerfile", "-t", tag, ".", timeout=900,
            )  # fmt: skip
    for tag, old in before.items():
        if old and old != _image_id(tag):
            run("podman", "rmi", old, check=False)
