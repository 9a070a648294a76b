"""Read a request body under a byte limit and validate it against a request model.

The limit is enforced while reading: a Content-Length over it is refused before any byte is
read, and a chunked body is counted as it arrives, so no more than the limit (plus one network
chunk) is ever buffered. JSON problems of any kind (invalid UTF-8, bad syntax, nesting too deep,
non-finite numbers, wrong types) become a 400 naming the offending field.
"""

from __future__ import annotations

import logging
import re
from typing import TypeVar

import anyio
from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from .errors import APIError, ClientGone, bad_request

log = logging.getLogger(__name__)

ModelT = TypeVar("ModelT", bound=BaseModel)

# A loc element that names a field (or is an index) rather than a union member's type tag.
_FIELD_NAME = re.compile(r"[a-z_][a-z0-9_]*")
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "none", "list", "dict"})


def _too_large(limit: int) -> APIError:
    message = f"request body is larger than the server's limit of {limit} bytes"
    return APIError(413, message, "invalid_request_error", None, "request_too_large")


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The whole body, or 413 as soon as it is known to exceed `limit` bytes, or 408 when it
    has not all arrived `timeout_s` after the headers."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    try:
        with anyio.fail_after(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise _too_large(limit)
                chunks.append(chunk)
    except ClientDisconnect as exc:
        raise ClientGone() from exc
    except TimeoutError:
        message = f"the request body did not arrive within {timeout_s:g} s"
        raise APIError(408, message, "invalid_request_error", None, "request_timeout") from None
    return b"".join(chunks)


def _param(loc: tuple[int | str, ...]) -> str | None:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif _FIELD_NAME.fullmatch(item) and item not in _TYPE_TAGS:
            parts.append(f".{item}" if parts else item)
        else:
            break
    return "".join(parts) or None


def validation_error(exc: ValidationError) -> APIError:
    """The first pydantic error as a 400, `param` the dotted path of the field."""
    error = exc.errors(include_url=False)[0]
    kind = error["type"]
    if kind == "json_invalid":
        return bad_request(f"the body is not valid JSON: {error['msg']}")
    if kind == "model_type" and not error["loc"]:
        return bad_request("the body must be a JSON object")
    param = _param(tuple(error["loc"]))
    if kind == "missing":
        return bad_request(f"missing required field {param!r}", param)
    return bad_request(f"invalid value for {param!r}: {error['msg']}", param)


def parse_body(body: bytes, model: type[ModelT]) -> ModelT:
    """Validate `body` (JSON bytes) against `model`; unknown fields are logged and ignored."""
    try:
        parsed = model.model_validate_json(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    if parsed.model_extra:
        log.debug("ignoring unknown fields: %s", sorted(parsed.model_extra))
    return parsed


async def read_request(
    request: Request, limit: int, timeout_s: float, model: type[ModelT]
) -> ModelT:
    """`read_body` then `parse_body`."""
    return parse_body(await read_body(request, limit, timeout_s), model)
