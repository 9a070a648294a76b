"""Who is calling: the Bearer key's grant (`KeyGrant`), checked in constant time.

A tenant's requests live in its own namespace (a salt subdivides it, never escapes it), its
flush reaches only that namespace, and only an admin flushes everything or reads `/debug/*`.
With no key configured, every caller is an admin without a tenant.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from tieredkv.config import KeyGrant, ServerConfig

from .errors import APIError

# Module-level so FastAPI can resolve the annotation (the dependency sees the Bearer token).
_BEARER = HTTPBearer(auto_error=False)
BearerCredentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]

OPEN_ACCESS = KeyGrant(tenant=None, admin=True)


def key_checker(config: ServerConfig) -> Callable:
    """A dependency returning the caller's `KeyGrant`, or refusing the request (401). Every
    configured key is compared, so the time taken says nothing about which one matched."""
    grants = [(key.encode(), grant) for key, grant in config.grants.items()]

    async def caller_grant(credentials: BearerCredentials) -> KeyGrant:
        if not grants:
            return OPEN_ACCESS
        given = credentials.credentials.encode() if credentials is not None else b""
        found = None
        for key, grant in grants:
            if hmac.compare_digest(given, key):
                found = grant
        if credentials is None or found is None:
            raise APIError(
                401, "missing or invalid API key", "authentication_error", None, "invalid_api_key"
            )
        return found

    return caller_grant


def require_admin(grant: KeyGrant, what: str) -> None:
    if not grant.admin:
        raise APIError(403, f"{what} needs an admin key", "permission_error", None, "forbidden")
