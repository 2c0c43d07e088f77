# The periodic-manager image (docs/deploy.md). `Dockerfile` is the same file under Docker's name.
#
#   podman build -t periodic-manager .        # or: docker build -t periodic-manager .
#   podman run --rm -p 127.0.0.1:8000:8000 periodic-manager            # embedded: SQLite + outbox
#
# Debian's python3 (security updates from Debian), the project in a venv built in the first stage
# and copied into a slim second one, a non-root user, configuration by PM_* variables only.
# Behind a TLS-intercepting proxy put its CA (*.crt) in deploy/ca-certificates/ before building.

ARG BASE=debian:bookworm-slim

FROM ${BASE} AS build
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt
COPY deploy/ca-certificates/ /usr/local/share/ca-certificates/
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates binutils \
 && find /usr/local/share/ca-certificates -type f ! -name '*.crt' -delete \
 && update-ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md LICENSE /src/
COPY periodic_manager /src/periodic_manager
COPY api /src/api
COPY migrations /src/migrations
# --no-compile, then compileall: one .pyc per module (none for the files dropped below), so a
# non-root process never compiles at start.
RUN python3 -m venv /opt/periodic-manager \
 && /opt/periodic-manager/bin/pip install --no-compile /src \
 && /opt/periodic-manager/bin/pip uninstall -y -q pip setuptools \
 && cd /opt/periodic-manager/lib/python3*/site-packages \
 && find . -depth -type d \( -name tests -o -name test -o -name __pycache__ \) -exec rm -rf {} + \
 && find . -type f \( -name '*.pyi' -o -name '*.pyx' -o -name '*.pxd' -o -name '*.c' \
      -o -name '*.h' -o -name '*.map' \) -delete \
 && rm -rf swagger_ui_bundle/vendor/*/swagger-ui-es-bundle*.js sqlalchemy/testing alembic/testing \
 && find . -name '*.so' -exec strip --strip-unneeded {} + \
 && python3 -m compileall -q -j 0 /opt/periodic-manager/lib

FROM ${BASE}
ARG VERSION=0.1.0
ARG SOURCE_URL=""
LABEL org.opencontainers.image.title="periodic-manager" \
      org.opencontainers.image.description="Dynamic periodic-task manager: schedules as database rows, enqueued exactly once per slot." \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.licenses="MIT"
ENV DEBIAN_FRONTEND=noninteractive
COPY deploy/ca-certificates/ /usr/local/share/ca-certificates/
RUN apt-get update \
 && apt-get upgrade -y \
 && apt-get install -y --no-install-recommends python3 ca-certificates \
 && find /usr/local/share/ca-certificates -type f ! -name '*.crt' -delete \
 && update-ca-certificates \
 && rm -rf /var/lib/apt/lists/* /var/cache/debconf/*-old /var/lib/dpkg/*-old /var/log/apt/* /var/log/dpkg.log \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/periodic-manager \
      --no-create-home --shell /usr/sbin/nologin periodic-manager \
 && install -d -o 10001 -g 10001 /var/lib/periodic-manager /run/periodic-manager
COPY --from=build /opt/periodic-manager /opt/periodic-manager
ENV PATH=/opt/periodic-manager/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PM_HOST=0.0.0.0 \
    PM_PORT=8000 \
    PM_PROBE_DIR=/run/periodic-manager
# The embedded default (SQLite ./periodic_manager.db) lands here; set PM_DATABASE_URL otherwise.
WORKDIR /var/lib/periodic-manager
USER 10001:10001
EXPOSE 8000
# The probe file of `run` (run.json) or of `manager` (manager.json); `api` writes none (its
# orchestrator probes GET /healthz instead: compose.yaml, deploy/kubernetes/).
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD ["/bin/sh", "-c", "if [ -e \"$PM_PROBE_DIR/run.json\" ]; then exec periodic-manager health --role run; else exec periodic-manager health --role manager; fi"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["periodic-manager"]
CMD ["run"]
