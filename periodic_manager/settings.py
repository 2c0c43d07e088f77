"""Settings from ``PM_*`` environment variables (and CLI flags, which override them).

:class:`CoreSettings` holds the manager's own; every installed target plugin adds its own
(:mod:`periodic_manager.targets.plugin`): :class:`Settings` is the core's and theirs together,
composed once at import.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_core import InitErrorDetails
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from periodic_manager.plugins import installed
from periodic_manager.schedules.partition import DEFAULT_PARTITIONS, MAX_PARTITIONS
from periodic_manager.schedules.rules import DEFAULT_MAX_PAYLOAD_BYTES, MAX_DURATION_S, TargetSet
from periodic_manager.targets import registry
from periodic_manager.targets.plugin import none_if_blank

MAX_CATCHUP_RATE = 100_000  # slots per second of a paced catch-up or backfill

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///./periodic_manager.db"


class CoreSettings(BaseSettings):
    """The settings of the manager itself. Defaults run embedded: SQLite file, outbox,
    127.0.0.1:8000."""

    model_config = SettingsConfigDict(env_prefix="PM_", extra="ignore")

    database_url: str = Field(
        DEFAULT_DATABASE_URL, description="SQLAlchemy URL of the schedule database"
    )
    target: str = Field(
        "outbox", description="default target: where due slots are enqueued (any installed one)"
    )
    targets: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="more targets to run beside the default (comma-separated in PM_TARGETS)"
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
    metrics_schedules: int = Field(
        100,
        ge=0,
        le=10_000,
        description="schedules with metric series of their own besides those with "
        "options.metrics true: the ones with the largest lateness seen (0: none)",
    )
    metrics_port: int | None = Field(
        None, ge=1, le=65535, description="Prometheus port of `manager`"
    )
    log_format: Literal["text", "json"] = Field("text", description="log lines as text or JSON")
    otel: bool = Field(
        False,
        description="export OpenTelemetry traces of every slot sent and of the API's requests "
        "(OTEL_* variables; the otel extra)",
    )
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

    @field_validator("api_token", "api_read_token", "probe_dir", mode="before")
    @classmethod
    def _blank(cls, v: object) -> object:
        return none_if_blank(v)

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
    def _installed(cls, v: str | tuple[str, ...]) -> str | tuple[str, ...]:
        for name in (v,) if isinstance(v, str) else v:
            if name not in installed.names():
                raise ValueError(installed.unknown(name))
            library = registry.plugin(name).library
            why = None if library is None else library.missing()
            if why is not None:
                raise ValueError(why)
        return v

    def configured_targets(self) -> TargetSet:
        """The targets this deployment runs: the default first, then ``targets`` (no repeats),
        with why each one that cannot tell when a task finished cannot (``options.overlap``), and
        why each one that cannot tell a failed task cannot (``options.pause_after_failures``)."""
        names = tuple(dict.fromkeys((self.target, *self.targets)))
        plugins = {name: registry.plugin(name) for name in names}
        return TargetSet(
            names,
            {n: why for n, p in plugins.items() if (why := p.completion(self)) is not None},
            {n: why for n, p in plugins.items() if (why := p.failure(self)) is not None},
        )

    def url_setting(self, target: str) -> str:
        """The setting that holds the URL ``target`` connects to (what an error about it names)."""
        return registry.plugin(target).url_setting(self)

    def refusals(self) -> list[InitErrorDetails]:
        """What the configured targets refuse in these settings (each one's ``refuse``), as
        errors of the field at fault."""
        errors: list[InitErrorDetails] = []
        for name in self.configured_targets():
            refusal = registry.plugin(name).refuse(self)
            if refusal is None:
                continue
            field = refusal.field or ("target" if name == self.target else "targets")
            error = ValueError(refusal.reason)
            input = getattr(self, field)
            errors.append(
                {"type": "value_error", "loc": (field,), "input": input, "ctx": {"error": error}}
            )
        return errors


class Settings(*registry.settings_models(), CoreSettings):  # type: ignore[misc]
    """Every setting: the core's and those of every installed target plugin. A setting a
    configured target refuses (a Redis Cluster for a target that needs a single Redis, SQLite
    for procrastinate) is a validation error of the field at fault, after every field passed."""

    def __init__(self, **values: Any) -> None:
        super().__init__(**values)
        refusals = self.refusals()
        if refusals:
            raise ValidationError.from_exception_data(type(self).__name__, refusals)
