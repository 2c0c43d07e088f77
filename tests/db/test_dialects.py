"""The registry of databases: each URL finds its database, and what differs between them is
asked of it (not of its name)."""

from __future__ import annotations

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table

from periodic_manager.db.dialects import DATABASES, Database, database_of
from periodic_manager.db.dialects.mysql import NamedLock
from periodic_manager.db.dialects.postgresql import AdvisoryLock
from periodic_manager.db.engine import normalize_url


@pytest.mark.parametrize(
    ("url", "name", "signal", "partitions", "elects"),
    [
        ("postgresql://u@h/db", "postgresql", "listen", True, True),
        ("postgresql+asyncpg://u@h/db", "postgresql", "listen", True, True),
        ("mysql://u@h/db", "mysql", "poll", False, True),
        ("mariadb://u@h/db", "mysql", "poll", False, True),
        ("sqlite:///x.db", "sqlite", None, False, False),
    ],
)
def test_each_url_finds_its_database_and_what_it_can_do(
    url: str, name: str, signal: str | None, partitions: bool, elects: bool
) -> None:
    database = database_of(url)
    assert database is DATABASES[name]
    assert (database.change_signal, database.partitions, database.elects_leader) == (
        signal,
        partitions,
        elects,
    )
    assert database_of(normalize_url(url)) is database  # the driver chosen is its own


def test_an_unknown_database_is_one_line_naming_the_supported_ones() -> None:
    with pytest.raises(
        ValueError,
        match=r"^unsupported database 'oracle': use postgresql, mysql/mariadb or sqlite$",
    ):
        database_of("oracle://u@h/db")


def test_the_leader_lock_is_the_databases_own() -> None:
    pg = database_of("postgresql://u@h/db").leader_lock("postgresql://u@h/db", name="x", timeout=3)
    my = database_of("mysql://u@h/a").leader_lock("mysql://u@h/a", name="x", timeout=3)
    other = database_of("mysql://u@h/b").leader_lock("mysql://u@h/b", name="x", timeout=3)
    assert isinstance(pg, AdvisoryLock) and isinstance(my, NamedLock)
    assert my.name != other.name  # named locks are the server's: each database its own
    with pytest.raises(ValueError, match="run one manager on SQLite"):
        database_of("sqlite:///x.db").leader_lock("sqlite:///x.db", name="x", timeout=3)


@pytest.mark.parametrize(
    ("name", "clause"),
    [
        ("postgresql", "ON CONFLICT (k) DO UPDATE SET v = excluded.v WHERE"),
        ("sqlite", "ON CONFLICT (k) DO UPDATE SET v = excluded.v WHERE"),
        ("mysql", "ON DUPLICATE KEY UPDATE v = CASE WHEN"),
    ],
)
def test_an_upsert_is_written_in_each_databases_words(name: str, clause: str) -> None:
    table = Table("t", MetaData(), Column("k", Integer, primary_key=True), Column("v", String))
    database: Database = DATABASES[name]
    stmt = database.upsert(table, ["k"], lambda new: [("v", new.v)], lambda new: new.v != "")
    from sqlalchemy.dialects import mysql, postgresql, sqlite

    dialect = {"postgresql": postgresql, "mysql": mysql, "sqlite": sqlite}[name].dialect()
    assert clause in " ".join(str(stmt.compile(dialect=dialect)).split())
