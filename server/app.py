"""The FastAPI application: OpenAI-compatible completions, models, health, metrics, cache
flush and (optionally) the cache debug view, all errors in OpenAI's shape."""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from tieredkv import __version__
from tieredkv.config import ServerConfig
from tieredkv.engine.protocol import EngineClient, EngineUnavailableError
from tieredkv.model.tokenizer import ChatTokenizer

from .completions import CompletionHandler
from .connections import SendStallLimit
from .errors import APIError, install_error_handlers
from .openapi import body_spec, error_responses, install_openapi
from .schemas import ChatCompletionRequest, CompletionRequest
from .translate import check_model

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


# Module-level so FastAPI can resolve the annotation (the dependency sees the Bearer token).
_BEARER = HTTPBearer(auto_error=False)
BearerCredentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]


def _auth_dependency(api_key: str | None) -> Callable:
    """A dependency refusing requests without the Bearer `api_key` (401); compared in
    constant time. No key: everything passes."""
    expected = api_key.encode() if api_key is not None else None

    async def require_api_key(
        credentials: BearerCredentials,
    ) -> None:
        if expected is None:
            return
        given = credentials.credentials.encode() if credentials is not None else b""
        if credentials is None or not hmac.compare_digest(given, expected):
            raise APIError(
                401, "missing or invalid API key", "authentication_error", None, "invalid_api_key"
            )

    return require_api_key


def create_app(
    engine: EngineClient,
    tokenizer: ChatTokenizer,
    server_config: ServerConfig,
    model_name: str,
    max_model_len: int,
    clock: Callable[[], float] = time.monotonic,
) -> FastAPI:
    """The app serving `engine` as the model `model_name`. `clock` stamps each request's
    arrival_time and must be the engine's clock. /health and /metrics are never guarded;
    /v1/* and /debug/* need the Bearer key when `server_config.api_key` is set."""
    app = FastAPI(title="tieredkv", version=__version__, docs_url=None, redoc_url=None)
    install_error_handlers(app)
    auth = [Depends(_auth_dependency(server_config.api_key))]
    handler = CompletionHandler(engine, tokenizer, server_config, model_name, max_model_len, clock)
    created = int(time.time())

    @app.post(
        "/v1/chat/completions",
        dependencies=auth,
        openapi_extra=body_spec(ChatCompletionRequest),
        responses=error_responses(400, 401, 404, 413, 429, 503),
    )
    async def chat_completions(request: Request) -> Response:
        return await handler.chat(request)

    @app.post(
        "/v1/completions",
        dependencies=auth,
        openapi_extra=body_spec(CompletionRequest),
        responses=error_responses(400, 401, 404, 413, 429, 503),
    )
    async def completions(request: Request) -> Response:
        return await handler.completion(request)

    def model_card() -> dict:
        return {
            "id": model_name,
            "object": "model",
            "created": created,
            "owned_by": "tieredkv",
            "max_model_len": max_model_len,
        }

    @app.get("/v1/models", dependencies=auth, responses=error_responses(401))
    async def list_models() -> dict:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model:path}", dependencies=auth, responses=error_responses(401, 404))
    async def get_model(model: str) -> dict:
        check_model(model, model_name)
        return model_card()

    @app.get("/health", responses=error_responses(503))
    async def health() -> JSONResponse:
        report = engine.health()
        ready = bool(report.get("ready"))
        body = {"status": "ok" if ready else "unavailable", **report, "ready": ready}
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        return Response(engine.render_metrics(), media_type=PROMETHEUS_CONTENT_TYPE)

    @app.post("/v1/cache/flush", dependencies=auth, responses=error_responses(401, 503))
    async def flush_cache() -> dict:
        _require_ready(engine)
        return {"flushed_pages": await engine.flush_cache()}

    if server_config.debug_endpoints:

        @app.get("/debug/cache", dependencies=auth, responses=error_responses(401, 503))
        async def debug_cache() -> dict:
            _require_ready(engine)
            return await engine.debug_cache()

    install_openapi(app)
    app.add_middleware(SendStallLimit, seconds=server_config.stall_timeout_s)
    return app


def _require_ready(engine: EngineClient) -> None:
    if not engine.health().get("ready"):
        raise EngineUnavailableError("the engine is starting or shutting down")
