#!/bin/sh
# Build debian:bookworm-slim locally, for a machine that reaches Debian's mirror but no image
# registry: debootstrap a minimal bookworm, trim it as Debian's -slim image is trimmed, and import
# it under the registry's name, so `FROM debian:bookworm-slim` resolves without a pull (on a
# machine that reaches Docker Hub the real image is used and this script is not needed).
# Does nothing when the image exists already. Needs root, debootstrap and podman.
set -eu
IMAGE=docker.io/library/debian:bookworm-slim
if podman image exists "$IMAGE"; then exit 0; fi
# The mirror apt uses on this machine (deb.debian.org by default).
MIRROR=$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
MIRROR=${MIRROR:-http://deb.debian.org/debian}
ROOT=$(mktemp -d)
trap 'rm -rf "$ROOT"' EXIT
debootstrap --variant=minbase bookworm "$ROOT" "$MIRROR" >/dev/null
# As the official image: sources with security updates, no docs or caches kept by apt and dpkg.
rm -f "$ROOT/etc/apt/sources.list"
cat > "$ROOT/etc/apt/sources.list.d/debian.sources" <<SOURCES
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
cat > "$ROOT/etc/dpkg/dpkg.cfg.d/docker" <<DPKG
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/lintian/*
DPKG
cat > "$ROOT/etc/apt/apt.conf.d/docker-clean" <<APT
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache ""; Dir::Cache::srcpkgcache "";
APT
# Security updates, as Debian's own image is rebuilt with them.
chroot "$ROOT" sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get upgrade -y -qq' >/dev/null
rm -f "$ROOT"/var/cache/debconf/*-old "$ROOT"/var/lib/dpkg/*-old "$ROOT"/var/log/dpkg.log \
  "$ROOT"/var/log/apt/*
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/cache/apt/*.bin "$ROOT"/var/lib/apt/lists/* \
  "$ROOT"/usr/share/man/* "$ROOT"/usr/share/info/* "$ROOT"/usr/share/locale/* \
  "$ROOT"/usr/share/groff/* "$ROOT"/usr/share/lintian/*
find "$ROOT/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete 2>/dev/null || true
tar -C "$ROOT" -c . | podman import -q --change 'CMD ["bash"]' - "$IMAGE" >/dev/null
