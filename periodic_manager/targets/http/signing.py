"""The signature of a delivery: ``X-PM-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>`` of
``"<t>.<body>"`` under the secret ``options.secret`` names (``PM_HTTP_SECRET_<NAME>`` in the
manager's environment, never in the row). A receiver recomputes it and refuses a ``t`` older
than its tolerance (docs/targets.md shows the check, 5 minutes)."""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping

SIGNATURE_HEADER = "X-PM-Signature"
SECRET_PREFIX = "PM_HTTP_SECRET_"
TOLERANCE_S = 300


def secret_variable(name: str) -> str:
    """The environment variable holding the secret ``name``."""
    return SECRET_PREFIX + name.upper()


def secret_of(name: str, environ: Mapping[str, str] | None = None) -> bytes | None:
    """The secret ``name`` from the environment (None: the variable is unset or empty)."""
    value = (os.environ if environ is None else environ).get(secret_variable(name), "")
    return value.encode() if value else None


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """The ``X-PM-Signature`` value of ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret, str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(
    secret: bytes, header: str, body: bytes, now: float, tolerance: float = TOLERANCE_S
) -> bool:
    """A receiver's check: the header's ``v1`` matches and its ``t`` is within ``tolerance``
    seconds of ``now``."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs(now - timestamp) > tolerance:
        return False
    expected = sign(secret, timestamp, body).split("v1=", 1)[1]
    return hmac.compare_digest(expected, parts.get("v1", ""))
