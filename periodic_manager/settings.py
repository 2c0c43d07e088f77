"""Settings from ``PM_*`` environment variables (and CLI flags, which override them)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from periodic_manager.schedules.partition import DEFAULT_PARTITIONS, MAX_PARTITIONS
from periodic_manager.schedules.rules import DEFAULT_MAX_PAYLOAD_BYTES, MAX_DURATION_S, TargetSet
from periodic_manager.targets import extras

MAX_CATCHUP_RATE = 100_000  # slots per second of a paced catch-up or backfill

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///./periodic_manager.db"
TargetName = Literal["redis", "outbox", "celery", "arq", "rq", "dramatiq", "procrastinate"]
# The targets that can run with redis_cluster (the outbox and procrastinate need no Redis).
CLUSTER_TARGETS = ("redis", "outbox", "procrastinate")


class Settings(BaseSettings):
    """Every setting of the service. Defaults run embedded: SQLite file, outbox, 127.0.0.1:8000."""

    model_config = SettingsConfigDict(env_prefix="PM_", extra="ignore")

    database_url: str = Field(
        DEFAULT_DATABASE_URL, description="SQLAlchemy URL of the schedule database"
    )
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis URL for the redis target")
    target: TargetName = Field("outbox", description="default target: where due slots are enqueued")
    targets: Annotated[tuple[TargetName, ...], NoDecode] = Field(
        (), description="more targets to run beside the default (comma-separated in PM_TARGETS)"
    )
    celery_broker_url: str | None = Field(
        None, description="Celery broker URL (default: the app's broker_url, else redis_url)"
    )
    celery_app: str | None = Field(
        None,
        description="your Celery app, 'package.module:app': its broker, queues and routes are honoured",
    )
    celery_publish_timeout: float = Field(
        5.0, gt=0, description="seconds one publish to the Celery broker may take"
    )
    celery_fast_path: bool = Field(
        True, description="write Celery messages to a Redis broker directly (false: always kombu)"
    )
    arq_redis_url: str | None = Field(
        None, description="Redis URL of the arq queues (default: redis_url)"
    )
    rq_redis_url: str | None = Field(
        None, description="Redis URL of the RQ queues (default: redis_url)"
    )
    dramatiq_url: str | None = Field(
        None,
        description="Dramatiq's broker, redis:// or amqp:// (default: redis_url); on RabbitMQ the "
        "claims live in redis_url",
    )
    dramatiq_namespace: str = Field(
        "dramatiq", min_length=1, description="the namespace (key prefix) of Dramatiq's RedisBroker"
    )
    redis_group: str | None = Field(
        None,
        description="consumer group your Redis Streams workers read with (consume_redis.py --group): "
        "how the redis target tells that a task finished (options.overlap skip/hold)",
    )
    celery_result_backend: str | None = Field(
        None,
        description="result backend the celery target reads to tell that a task finished "
        "(options.overlap skip/hold); default: your app's result_backend",
    )
    sync_interval: float = Field(30.0, gt=0, description="seconds between syncs of periodic_jobs")
    grace: float = Field(30.0, ge=0, description="seconds a slot may be late and still be enqueued")
    heartbeat_interval: float = Field(5.0, gt=0, description="seconds between manager heartbeats")
    leader_election: bool | None = Field(
        None,
        description="one leader among managers (default: on for PostgreSQL and MariaDB/MySQL, off for SQLite)",
    )
    leader_poll_interval: float = Field(
        1.0, gt=0, description="seconds between leadership tries/checks"
    )
    leader_timeout: float = Field(
        3.0,
        gt=0,
        description="a silent leader's session ends after this; takeover <= timeout + poll",
    )
    coordination: Literal["auto", "leader", "partitions"] = Field(
        "auto",
        description="how managers share the work: one leader (advisory lock, GET_LOCK) or every "
        "manager leasing a fair share of the partitions (PostgreSQL); auto: partitions on "
        "PostgreSQL unless leader_election is set, leader elsewhere",
    )
    lease_ttl: float = Field(
        15.0, ge=1, le=300, description="seconds a partition lease runs unrenewed (partitions mode)"
    )
    target_ping_interval: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="seconds between pings of a manager's targets (partitions or leader mode)",
    )
    target_ping_failures: int = Field(
        2,
        ge=1,
        le=1000,
        description="failed pings in a row of every target after which a manager stands down: it "
        "hands over its partitions (or leadership) and takes none until a target answers",
    )
    partitions: int = Field(
        DEFAULT_PARTITIONS,
        ge=1,
        le=MAX_PARTITIONS,
        description="number of partitions, read by `migrate` when it creates pm_partitions",
    )
    catchup_window: float = Field(
        3600.0,
        gt=0,
        le=MAX_DURATION_S,
        description="default window of misfire=fire_once/all catch-up, seconds (at most 366 days)",
    )
    catchup_rate: float = Field(
        50.0,
        gt=0,
        le=MAX_CATCHUP_RATE,
        description="slots per second a misfire=all catch-up (per manager) and a backfill send",
    )
    max_payload_bytes: int = Field(
        DEFAULT_MAX_PAYLOAD_BYTES,
        ge=64,
        description="limit of a schedule's payload and of its options, bytes of canonical JSON",
    )
    full_sync_interval: float = Field(
        300.0, gt=0, description="seconds between full reconciles (syncs read only changes between)"
    )
    listen: bool | None = Field(
        None, description="LISTEN for the change trigger (default: on for PostgreSQL)"
    )
    poll_interval: float = Field(
        1.0,
        gt=0,
        le=3600,
        description="MariaDB/MySQL (no LISTEN): seconds between polls of the change revision "
        "(one indexed query when nothing changed)",
    )
    host: str = Field("127.0.0.1", description="API bind address")
    port: int = Field(8000, ge=0, le=65535, description="API port")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field("INFO")
    redis_maxlen: int | None = Field(None, gt=0, description="approximate MAXLEN per stream")
    redis_cluster: bool = Field(
        False,
        description="redis_url names a node of a Redis Cluster: the redis target uses a cluster "
        "client (only the redis and outbox targets can run on a cluster)",
    )
    stream_prefix: str = Field("pm", description="prefix of Redis keys")
    # -- API, history, operations
    api_token: SecretStr | None = Field(None, description="bearer token required by the API")
    api_read_token: SecretStr | None = Field(None, description="bearer token allowing GET only")
    runs_retention: float = Field(7.0, gt=0, le=1_000_000, description="days of run history kept")
    runs_max_per_schedule: int = Field(
        100, ge=0, description="newest runs kept per schedule (0: none)"
    )
    changes_retention: float = Field(
        90.0, gt=0, le=1_000_000, description="days of change history kept"
    )
    changes_max_per_schedule: int = Field(
        1000, ge=1, le=1_000_000, description="newest changes kept per schedule"
    )
    metrics_port: int | None = Field(
        None, ge=1, le=65535, description="Prometheus port of `manager`"
    )
    log_format: Literal["text", "json"] = Field("text", description="log lines as text or JSON")
    # -- operations: probes, exposure, limits
    metrics_host: str = Field(
        "127.0.0.1", description="address of the `manager` metrics port (no auth: loopback default)"
    )
    probe_dir: str | None = Field(
        None, description="directory of the liveness probe file `<role>.json` (manager and run)"
    )
    probe_interval: float = Field(5.0, gt=0, le=3600, description="seconds between probe writes")
    allowed_hosts: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        description="Host names the API answers (comma-separated; `*` for any); default: loopback "
        "names and the bind address",
    )
    max_body_bytes: int = Field(
        1_048_576, ge=1024, description="largest request body the API reads (413 beyond)"
    )

    @field_validator("api_token", "api_read_token", mode="before")
    @classmethod
    def _blank_token(cls, v: object) -> object:
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("redis_group", "celery_result_backend", mode="before")
    @classmethod
    def _blank(cls, v: object) -> object:
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("celery_app", mode="before")
    @classmethod
    def _celery_app(cls, v: object) -> object:
        if isinstance(v, str) and not v.strip():
            return None
        if isinstance(v, str):
            from periodic_manager.targets.celery.app import load_app

            load_app(v.strip())  # fail at start, naming the setting, not at the first slot
            return v.strip()
        return v

    @field_validator("dramatiq_url")
    @classmethod
    def _dramatiq_url(cls, v: str | None) -> str | None:
        if v is None:  # defaults are validated too: importing the target for nothing costs ~70 ms
            return None
        from periodic_manager.targets.dramatiq import check_url

        return check_url(v)

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, v: object) -> object:
        return v.upper() if isinstance(v, str) else v

    @field_validator("database_url")
    @classmethod
    def _db_url(cls, v: str) -> str:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            make_url(v)
        except ArgumentError:
            raise ValueError(
                "not a database URL (e.g. postgresql://user@host/db or sqlite:///file.db)"
            ) from None
        from periodic_manager.db.dialects import database_of

        database_of(v).check_driver()  # ValueError: unsupported, or its driver missing
        return v

    @field_validator("coordination")
    @classmethod
    def _partitions_database(cls, v: str, info: ValidationInfo) -> str:
        # database_url is declared first: a bad URL is reported, not this.
        url = info.data.get("database_url")
        if v == "partitions" and isinstance(url, str):
            from periodic_manager.db.dialects import database_of

            database = database_of(url)
            if database.elects_leader and not database.partitions:  # SQLite: one manager anyway
                raise ValueError(
                    "partitions need PostgreSQL; on MariaDB/MySQL use coordination=leader (GET_LOCK)"
                )
        return v

    @property
    def coordination_mode(self) -> Literal["leader", "partitions"]:
        """The coordination in effect. ``auto``: partitions on PostgreSQL, unless
        ``leader_election`` is set (a deployment that chose its election keeps it); leader on
        MariaDB/MySQL (no partitions there). SQLite: leader whatever was named (one manager
        holds every schedule there)."""
        from periodic_manager.db.dialects import database_of

        database = database_of(self.database_url)
        if not database.elects_leader:  # one manager holds every schedule (SQLite)
            return "leader"
        if self.coordination != "auto":
            return self.coordination
        if self.leader_election is not None or not database.partitions:
            return "leader"
        return "partitions"

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, v: object) -> object:
        if isinstance(v, str):
            return tuple(h.strip().lower() for h in v.split(",") if h.strip())
        return v

    @field_validator("probe_dir", mode="before")
    @classmethod
    def _blank_dir(cls, v: object) -> object:
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("targets", mode="before")
    @classmethod
    def _split_targets(cls, v: object) -> object:
        if isinstance(v, str):
            return tuple(name.strip().lower() for name in v.split(",") if name.strip())
        return v

    @field_validator("target", mode="before")
    @classmethod
    def _lower_target(cls, v: object) -> object:
        return v.strip().lower() if isinstance(v, str) else v

    @field_validator("target", "targets")
    @classmethod
    def _extras_installed(cls, v: str | tuple[str, ...]) -> str | tuple[str, ...]:
        for name in (v,) if isinstance(v, str) else v:
            why = extras.missing(name)
            if why is not None:
                raise ValueError(why)
        return v

    @field_validator("target", "targets")
    @classmethod
    def _postgresql_targets(
        cls, v: str | tuple[str, ...], info: ValidationInfo
    ) -> str | tuple[str, ...]:
        # database_url is declared first: a bad URL is reported, not this.
        url = info.data.get("database_url")
        names = (v,) if isinstance(v, str) else v
        if "procrastinate" in names and isinstance(url, str) and not url.startswith("postgres"):
            raise ValueError(
                "the procrastinate target needs PostgreSQL (procrastinate is PostgreSQL only): "
                "set PM_DATABASE_URL to a postgresql:// database"
            )
        return v

    @field_validator("redis_cluster")
    @classmethod
    def _cluster_targets(cls, v: bool, info: ValidationInfo) -> bool:
        # Declared after target and targets: a bad one of those is reported, not this.
        names = (info.data.get("target"), *info.data.get("targets", ()))
        refused = [n for n in dict.fromkeys(names) if n is not None and n not in CLUSTER_TARGETS]
        if v and refused:
            raise ValueError(
                f"the {' and '.join(refused)} target{'s' if len(refused) > 1 else ''} cannot run "
                "on a Redis Cluster (only redis, outbox and procrastinate can): unset PM_REDIS_CLUSTER or use "
                "a single Redis"
            )
        return v

    def configured_targets(self) -> TargetSet:
        """The targets this deployment runs: the default first, then ``targets`` (no repeats),
        with why each one that cannot tell when a task finished cannot (``options.overlap``), and
        why each one that cannot tell a failed task cannot (``options.pause_after_failures``)."""
        from periodic_manager.targets import completion

        names = tuple(dict.fromkeys((self.target, *self.targets)))
        missing: dict[str, str] = {}
        if "redis" in names and (why := completion.redis(self.redis_group)) is not None:
            missing["redis"] = why
        if "dramatiq" in names:
            missing["dramatiq"] = completion.dramatiq()
        if "celery" in names:
            why = completion.celery(self.celery_backend() is not None)
            if why is not None:
                missing["celery"] = why
        no_failure: dict[str, str] = {
            "redis": completion.REDIS_NO_FAILURE,
            "outbox": completion.OUTBOX_NO_FAILURE,
            "dramatiq": completion.DRAMATIQ_NO_FAILURE,
        }
        if (why := completion.celery_failure(self.celery_backend() is not None)) is not None:
            no_failure["celery"] = why
        return TargetSet(names, missing, {n: w for n, w in no_failure.items() if n in names})

    def url_setting(self, target: str) -> str:
        """The setting that holds the URL ``target`` connects to (what an error about it names):
        the target's own URL setting when set, else the one it falls back to, as
        :meth:`dramatiq_broker` and :meth:`celery_broker` resolve them."""
        own = {
            "celery": ("PM_CELERY_BROKER_URL", self.celery_broker_url),
            "arq": ("PM_ARQ_REDIS_URL", self.arq_redis_url),
            "rq": ("PM_RQ_REDIS_URL", self.rq_redis_url),
            "dramatiq": ("PM_DRAMATIQ_URL", self.dramatiq_url),
        }.get(target)
        if own is not None and own[1] is not None:
            return own[0]
        if target == "celery" and self.celery_app is not None:
            return "PM_CELERY_APP"
        return "PM_DATABASE_URL" if target in ("outbox", "procrastinate") else "PM_REDIS_URL"

    def dramatiq_broker(self) -> str:
        """The broker the dramatiq target sends to: ``dramatiq_url``, else ``redis_url``."""
        return self.dramatiq_url or self.redis_url

    def celery_broker(self) -> str:
        """The broker the celery target publishes to: ``celery_broker_url``, else the
        ``broker_url`` of ``celery_app``, else ``redis_url``."""
        if self.celery_broker_url is not None:
            return self.celery_broker_url
        if self.celery_app is not None:
            from periodic_manager.targets.celery.app import load_app

            broker = load_app(self.celery_app).conf.broker_url
            if isinstance(broker, str) and broker:
                return broker
        return self.redis_url

    def celery_backend(self) -> str | None:
        """The result backend of the celery target: ``celery_result_backend``, else the
        ``result_backend`` of ``celery_app``; None without one."""
        if self.celery_result_backend is not None:
            return self.celery_result_backend
        if self.celery_app is None:
            return None
        from periodic_manager.targets.celery.app import load_app

        backend = load_app(self.celery_app).conf.result_backend
        if not isinstance(backend, str) or backend in ("", "disabled"):
            return None
        return backend
