"""A tenant's cache namespaces: its own (`\\0tenant\\0NAME`) and the subdivisions its salts make
(`\\0tenant\\0NAME\\0SALT`). No salt or header can name one (they cannot hold NUL), so no
request escapes into another tenant's namespaces; what is bounded per tenant (pins) adds up
over all of them.
"""

from __future__ import annotations

TENANT_PREFIX = "\0tenant\0"


def tenant_namespace(tenant: str, salt: str | None = None) -> str:
    """A tenant's namespace, or one subdivision of it."""
    return f"{TENANT_PREFIX}{tenant}" if salt is None else f"{TENANT_PREFIX}{tenant}\0{salt}"


def in_tenant(namespace: str, tenant: str) -> bool:
    """Is `namespace` the tenant's own or one of its subdivisions?"""
    own = tenant_namespace(tenant)
    return namespace == own or namespace.startswith(own + "\0")


def split_namespace(namespace: str) -> tuple[str | None, str | None]:
    """(tenant, salt) of a namespace: (NAME, None) for a tenant's own, (NAME, SALT) for a
    subdivision, (None, namespace) for one no tenant owns ("" is the shared default)."""
    if not namespace.startswith(TENANT_PREFIX):
        return None, namespace
    tenant, divided, salt = namespace[len(TENANT_PREFIX) :].partition("\0")
    return tenant, salt if divided else None


def namespace_owner(namespace: str) -> str:
    """What shares one budget: a tenant's own namespace for every namespace of that tenant,
    the namespace itself otherwise."""
    tenant, _ = split_namespace(namespace)
    return namespace if tenant is None else tenant_namespace(tenant)
