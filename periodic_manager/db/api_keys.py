"""The one reader and writer of ``pm_api_keys``: API keys by name, looked up by id.

Only the SHA-256 of a key's secret is stored (:mod:`periodic_manager.access`). Rows are untrusted
like every table (plain SQL may write them): a row whose scope is not a known scope, or whose
digest is not 64 hex digits, authenticates nobody. ``last_used_at`` is written by
:func:`touch` only when the stored one is a minute old or more, so a busy key costs one write a
minute, not one per request, whichever process serves it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from periodic_manager import access
from periodic_manager.access import Scope
from periodic_manager.db.models import api_keys_table
from periodic_manager.errors import ConfigError

K = api_keys_table.c
TOUCH_EVERY = timedelta(minutes=1)
MAX_KEYS = 10_000  # listed at most


@dataclass(frozen=True, slots=True)
class StoredKey:
    """A key as stored. ``scope`` is None when the row holds no known scope (it allows nothing)."""

    key_id: str
    name: str
    namespace: str
    scope: Scope | None
    secret_sha256: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None

    def state(self, now: datetime) -> str:
        """``active``, ``revoked`` or ``expired`` at ``now``."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"


_COLUMNS = (
    K.key_id,
    K.name,
    K.namespace,
    K.scope,
    K.secret_sha256,
    K.created_at,
    K.expires_at,
    K.revoked_at,
    K.last_used_at,
)


def _scope(value: object) -> Scope | None:
    try:
        return Scope(str(value))
    except ValueError:
        return None


def _stored(row: tuple[object, ...]) -> StoredKey:
    key_id, name, namespace, scope, sha, created, expires, revoked, used = row
    return StoredKey(
        str(key_id),
        str(name),
        str(namespace),
        _scope(scope),
        str(sha),
        created,  # type: ignore[arg-type]  # Instant columns read as aware datetimes
        expires,  # type: ignore[arg-type]
        revoked,  # type: ignore[arg-type]
        used,  # type: ignore[arg-type]
    )


async def create(
    conn: AsyncConnection,
    name: str,
    scope: Scope,
    now: datetime,
    expires_at: datetime | None = None,
    namespace: str = access.DEFAULT_NAMESPACE,
) -> tuple[StoredKey, str]:
    """Make key ``name`` (checked name, scope and expiry) and commit; returns the row and the
    key's text, which exists nowhere else. ConfigError ``name`` (code ``name-taken``) when a key
    of that name exists, revoked ones included."""
    key_id, text, sha = access.new_key()
    row = (key_id, name, namespace, scope.value, sha, now, expires_at, None, None)
    try:
        await conn.execute(insert(api_keys_table).values(dict(zip(K.keys(), row, strict=True))))
    except IntegrityError:
        await conn.rollback()
        raise ConfigError(
            "name",
            f"a key named {name!r} exists already (revoked keys keep their name)",
            code="name-taken",
        ) from None
    await conn.commit()
    return _stored(row), text


async def read_all(conn: AsyncConnection) -> list[StoredKey]:
    """Every key by name (at most MAX_KEYS), revoked and expired ones included."""
    rows = await conn.execute(select(*_COLUMNS).order_by(K.name).limit(MAX_KEYS))
    return [_stored(tuple(r)) for r in rows]


async def by_id(conn: AsyncConnection, key_id: str) -> StoredKey | None:
    row = (await conn.execute(select(*_COLUMNS).where(K.key_id == key_id))).first()
    return None if row is None else _stored(tuple(row))


async def revoke(conn: AsyncConnection, name: str, now: datetime) -> StoredKey | None:
    """Revoke key ``name`` and commit (a revoked key stays revoked, at its first time); None when
    there is no such key."""
    await conn.execute(
        update(api_keys_table).where(K.name == name, K.revoked_at.is_(None)).values(revoked_at=now)
    )
    row = (await conn.execute(select(*_COLUMNS).where(K.name == name))).first()
    await conn.commit()
    return None if row is None else _stored(tuple(row))


async def touch(conn: AsyncConnection, key: StoredKey, now: datetime) -> bool:
    """Record that ``key`` was used at ``now`` if its ``last_used_at`` is TOUCH_EVERY old or
    more (the condition is in the statement: racing processes write once); True if written."""
    if key.last_used_at is not None and now - key.last_used_at < TOUCH_EVERY:
        return False
    done = await conn.execute(
        update(api_keys_table)
        .where(
            K.key_id == key.key_id,
            or_(K.last_used_at.is_(None), K.last_used_at <= now - TOUCH_EVERY),
        )
        .values(last_used_at=now)
    )
    await conn.commit()
    return bool(done.rowcount)


async def any_key(conn: AsyncConnection) -> bool:
    """Whether any key was ever made (revoked and expired ones count: revoking the last key must
    not open the API)."""
    return (await conn.execute(select(K.key_id).limit(1))).first() is not None


async def active_admin(conn: AsyncConnection, now: datetime) -> bool:
    """Whether an admin key that is neither revoked nor expired exists."""
    found = await conn.execute(
        select(K.key_id)
        .where(
            K.scope == Scope.ADMIN.value,
            K.revoked_at.is_(None),
            or_(K.expires_at.is_(None), K.expires_at > now),
        )
        .limit(1)
    )
    return found.first() is not None
