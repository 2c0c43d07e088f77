"""API keys and their scopes: what a key may do, how a key looks, and what is stored of it.

A key is ``pmk_<id>_<secret>``: ``id`` (12 hex digits) names its row and may be shown (logs,
``keys list``); ``secret`` (43 URL-safe characters, 256 random bits from :mod:`secrets`) is shown
once, at creation, and only its SHA-256 is stored. A fast hash is enough here: slow hashes
(bcrypt, argon2) make guessing a *low-entropy* password costly, but no one can enumerate 2**256
secrets whatever the hash costs, and a slow hash would cost CPU on every request.

Scopes are ordered, each allowing what the ones below allow: ``read`` < ``trigger`` (manual
triggers, backfills, pause and resume) < ``write`` (create, edit, delete schedules) < ``admin``
(API keys, and what every namespace shares: calendars). Which route needs which scope:
``api/scopes.py``. ``namespace`` is stored with every key for the namespaces to come; today every
key is of namespace ``default`` and reaches every schedule.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import datetime
from enum import StrEnum
from typing import Any

from periodic_manager.errors import ConfigError
from periodic_manager.schedules.bounds import parse_instant

PREFIX = "pmk_"
ID_HEX = 12  # hex digits of a key's id (48 bits: never the secret part, only its name)
SECRET_BYTES = 32
DEFAULT_NAMESPACE = "default"
NAME_PATTERN = "[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
NAME_RULE = "1-64 characters: letters, digits, '_', '.', '-', starting with a letter or digit"
_NAME_RE = re.compile(rf"^{NAME_PATTERN}\Z")
_KEY_RE = re.compile(rf"^{PREFIX}([0-9a-f]{{{ID_HEX}}})_([A-Za-z0-9_-]{{43}})\Z")


class Scope(StrEnum):
    """What a key may do, in increasing order (each allows what the ones before allow)."""

    READ = "read"
    TRIGGER = "trigger"
    WRITE = "write"
    ADMIN = "admin"

    @property
    def rank(self) -> int:
        return _ORDER.index(self)

    def allows(self, needed: Scope) -> bool:
        """Whether a caller of this scope may do what needs ``needed``."""
        return self.rank >= needed.rank


_ORDER = list(Scope)


def check_scope(value: Any, field: str = "scope") -> Scope:
    """``value`` as a scope; ConfigError naming ``field`` otherwise."""
    try:
        return Scope(value)
    except ValueError:
        shown = value[:40] if isinstance(value, str) else type(value).__name__
        names = ", ".join(s.value for s in Scope)
        raise ConfigError(field, f"must be one of {names} (got {shown!r})") from None


def check_name(value: Any, field: str = "name") -> str:
    """A key's name; ConfigError naming ``field`` otherwise."""
    if not isinstance(value, str) or not _NAME_RE.match(value):
        shown = value[:70] if isinstance(value, str) else type(value).__name__
        raise ConfigError(field, f"must be a key name ({NAME_RULE}); got {shown!r}")
    return value


def check_expiry(value: datetime | None, now: datetime, field: str = "expires_at") -> None:
    """An expiry must be in the future (None: the key never expires)."""
    if value is not None and value <= now:
        raise ConfigError(field, f"must be after now ({now.isoformat()})")


def key_request(
    name: Any, scope: Any, expires_at: str | None, now: datetime
) -> tuple[str, Scope, datetime | None]:
    """A new key's name, scope and expiry (ISO 8601 with an offset, or None: never), judged
    alike for the API and the CLI; ConfigError naming the field at fault."""
    expiry = None
    if expires_at is not None:
        try:
            expiry = parse_instant(expires_at)
        except ValueError as exc:
            raise ConfigError("expires_at", str(exc)) from None
        check_expiry(expiry, now)
    return check_name(name), check_scope(scope), expiry


def digest(secret: str) -> str:
    """What is stored of a secret: its SHA-256, 64 hex digits."""
    return hashlib.sha256(secret.encode()).hexdigest()


def new_key() -> tuple[str, str, str]:
    """A fresh key: ``(key id, the key as the caller sends it, digest of its secret)``."""
    key_id = secrets.token_hex(ID_HEX // 2)
    secret = secrets.token_urlsafe(SECRET_BYTES)
    return key_id, f"{PREFIX}{key_id}_{secret}", digest(secret)


def split_key(text: str) -> tuple[str, str] | None:
    """``(key id, secret)`` of a key's text; None when it is not shaped as a key."""
    found = _KEY_RE.match(text)
    return (found.group(1), found.group(2)) if found else None
