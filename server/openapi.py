"""The OpenAPI description of the real request bodies.

The completion routes read their bodies themselves (to enforce the size limit while reading
and to turn every validation failure into a 400), so FastAPI cannot infer them: each route
points at a component schema generated from the pydantic model, and `install_openapi` adds
those components to the generated document.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema

from .schemas import REQUEST_MODELS, ErrorResponse

_REF = "#/components/schemas/{model}"
_STATUS_TEXT = {
    400: "Invalid request",
    401: "Missing or wrong API key",
    403: "The key may not do this",
    404: "Unknown model or route",
    408: "Headers or body not sent in time",
    413: "Body larger than --max-request-bytes",
    429: "The queue is full",
    503: "Starting or shutting down",
}


def body_spec(model: type) -> dict[str, Any]:
    """`openapi_extra` for a route whose JSON body is `model`; also documents the namespace
    header both completion endpoints accept."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": _REF.format(model=model.__name__)}}
            },
        },
        "parameters": [
            {
                "name": "X-Cache-Namespace",
                "in": "header",
                "required": False,
                "description": "KV cache namespace (1..256 bytes); must equal cache_salt if both",
                "schema": {"type": "string"},
            }
        ],
    }


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` entries documenting the errors a route can answer with."""
    return {s: {"model": ErrorResponse, "description": _STATUS_TEXT[s]} for s in statuses}


def install_openapi(app: FastAPI) -> None:
    """Generate the document once, with the request models among its components."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, routes=app.routes, description=""
            )
            _, definitions = models_json_schema(
                [(m, "validation") for m in REQUEST_MODELS], ref_template=_REF
            )
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for name, definition in definitions.get("$defs", {}).items():
                components.setdefault(name, definition)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
