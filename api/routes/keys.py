"""API keys: ``/keys`` (admin scope, ``api/scopes.py``). A key is shown once, in the answer that
creates it; only the SHA-256 of its secret is stored (``periodic_manager.access``). Read and
written through ``periodic_manager.db.api_keys``, as ``periodic-manager keys`` does."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field

from periodic_manager import access
from periodic_manager.db import api_keys
from periodic_manager.errors import ConfigError

from ..deps import Conn, Now, get_state
from ..errors import ApiProblem

router = APIRouter(prefix="/keys", tags=["keys"])

Name = Annotated[str, Path(min_length=1, max_length=64, pattern=f"^{access.NAME_PATTERN}$")]
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "No such key"}}


class KeyIn(BaseModel):
    """The body of ``POST /keys``."""

    model_config = ConfigDict(extra="forbid")

    name: Any = Field(description=access.NAME_RULE, examples=["ci-deployer"])
    scope: Any = Field(description="read, trigger, write or admin", examples=["write"])
    expires_at: Any = Field(
        None,
        description="when it stops working (ISO 8601 with a UTC offset); null: never",
        examples=["2027-01-01T00:00:00Z"],
    )


class KeyOut(BaseModel):
    """A key as stored: never its secret."""

    name: str
    key_id: str = Field(description="the public part of the key: pmk_<key_id>_<secret>")
    namespace: str = Field(description="always 'default' until there are namespaces")
    scope: str | None = Field(description="null when the stored value is not a known scope")
    state: str = Field(examples=["active", "revoked", "expired"])
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None = Field(description="updated at most once a minute")


class KeyCreated(KeyOut):
    key: str = Field(description="the key: shown this once, store it now (only a hash is kept)")


class KeyList(BaseModel):
    items: list[KeyOut]


def _out(key: api_keys.StoredKey, now: datetime) -> dict[str, Any]:
    return {
        "name": key.name,
        "key_id": key.key_id,
        "namespace": key.namespace,
        "scope": key.scope.value if key.scope is not None else None,
        "state": key.state(now),
        "created_at": key.created_at,
        "expires_at": key.expires_at,
        "revoked_at": key.revoked_at,
        "last_used_at": key.last_used_at,
    }


@router.get("", response_model=KeyList, summary="Every API key, by name (never a secret)")
async def list_keys(conn: Conn, now: Now) -> KeyList:
    return KeyList(items=[KeyOut(**_out(k, now)) for k in await api_keys.read_all(conn)])


@router.post(
    "",
    response_model=KeyCreated,
    status_code=status.HTTP_201_CREATED,
    responses={409: {"description": "A key of that name exists (revoked keys keep theirs)"}},
    summary="Create an API key; the answer is the only place its secret is ever shown",
)
async def create_key(body: KeyIn, request: Request, conn: Conn, now: Now) -> KeyCreated:
    name, scope, expires_at = access.key_request(body.name, body.scope, body.expires_at, now)
    try:
        key, text = await api_keys.create(conn, name, scope, now, expires_at)
    except ConfigError as exc:
        if exc.code != "name-taken":
            raise
        raise ApiProblem(409, "name-conflict", str(exc)) from None
    get_state(request).keys_seen = True  # auth is on from the next request
    return KeyCreated(key=text, **_out(key, now))


@router.delete(
    "/{name}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=NOT_FOUND,
    summary="Revoke a key: refused from the next request (its row stays, marked revoked)",
)
async def revoke_key(name: Name, conn: Conn, now: Now) -> Response:
    if await api_keys.revoke(conn, name, now) is None:
        raise ApiProblem(404, "not-found", f"no key named {name!r}")
    return Response(status_code=status.HTTP_204_NO_CONTENT)
