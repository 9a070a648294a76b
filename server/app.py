"""The FastAPI application: OpenAI-compatible completions, models, health, metrics, cache
flush and (optionally) the cache debug view, all errors in OpenAI's shape."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from tieredkv import __version__
from tieredkv.config import KeyGrant, ServerConfig
from tieredkv.engine.protocol import EngineClient, EngineUnavailableError
from tieredkv.model.tokenizer import ChatTokenizer

from .auth import key_checker, require_admin
from .completions import CompletionHandler
from .errors import install_error_handlers
from .generation_inputs import check_model
from .openapi import body_spec, error_responses, install_openapi
from .pins import PinHandler
from .schemas import ChatCompletionRequest, CompletionRequest, PinRequest
from .worker_info import install_worker_info

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def create_app(
    engine: EngineClient,
    tokenizer: ChatTokenizer,
    server_config: ServerConfig,
    model_name: str,
    max_model_len: int,
    clock: Callable[[], float] = time.monotonic,
    pins_at_start: Sequence[PinRequest] = (),
) -> FastAPI:
    """The app serving `engine` as the model `model_name`. `clock` stamps each request's
    arrival_time and must be the engine's clock. /health, /metrics and the router's worker
    endpoints (`worker_info`) are never guarded; /v1/*, /debug/* and /openapi.json need a
    Bearer key when keys are configured (`auth`). Once serving, it pins again what an earlier
    run pinned, then `pins_at_start` (`--pin-file`), in the background."""
    pins = PinHandler(engine, tokenizer, server_config, model_name, max_model_len)

    app = FastAPI(
        title="tieredkv",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    # started by the runner once it serves (`runner.GracefulServer`)
    app.state.at_start = [lambda: pins.pin_at_start(list(pins_at_start))]
    install_error_handlers(app)
    authenticated = Depends(key_checker(server_config))  # the caller's KeyGrant
    handler = CompletionHandler(engine, tokenizer, server_config, model_name, max_model_len, clock)
    created = int(time.time())

    @app.post(
        "/v1/chat/completions",
        openapi_extra=body_spec(ChatCompletionRequest),
        responses=error_responses(400, 401, 404, 408, 413, 429, 503),
    )
    async def chat_completions(request: Request, caller: KeyGrant = authenticated) -> Response:
        return await handler.chat(request, caller)

    @app.post(
        "/v1/completions",
        openapi_extra=body_spec(CompletionRequest),
        responses=error_responses(400, 401, 404, 408, 413, 429, 503),
    )
    async def completions(request: Request, caller: KeyGrant = authenticated) -> Response:
        return await handler.completion(request, caller)

    def model_card() -> dict:
        return {
            "id": model_name,
            "object": "model",
            "created": created,
            "owned_by": "tieredkv",
            "max_model_len": max_model_len,
        }

    @app.get("/v1/models", responses=error_responses(401))
    async def list_models(caller: KeyGrant = authenticated) -> dict:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model:path}", responses=error_responses(401, 404))
    async def get_model(model: str, caller: KeyGrant = authenticated) -> dict:
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

    @app.post("/v1/cache/flush", responses=error_responses(401, 503))
    async def flush_cache(caller: KeyGrant = authenticated) -> dict:
        """Every namespace for an admin key, the caller's tenant's for a tenant key."""
        _require_ready(engine)
        tenant = caller.tenant
        if caller.admin or tenant is None:
            return {"flushed_pages": await engine.flush_cache()}
        return {"flushed_pages": await engine.flush_cache(tenant=tenant)}

    @app.post(
        "/v1/cache/pin",
        openapi_extra=body_spec(PinRequest),
        responses=error_responses(400, 401, 404, 413, 503),
    )
    async def pin(request: Request, caller: KeyGrant = authenticated) -> dict:
        """Compute a prompt's pages and keep them at least on host until unpinned."""
        _require_ready(engine)
        return await pins.pin(request, caller)

    @app.delete(
        "/v1/cache/pin",
        openapi_extra=body_spec(PinRequest),
        responses=error_responses(400, 401, 404, 413, 503),
    )
    async def unpin(request: Request, caller: KeyGrant = authenticated) -> dict:
        _require_ready(engine)
        return await pins.unpin(request, caller)

    @app.get("/v1/cache/pins", responses=error_responses(401, 403, 503))
    async def list_pins(tenant: str | None = None, caller: KeyGrant = authenticated) -> dict:
        """Every namespace's pins, or one tenant's (an admin key only)."""
        _require_ready(engine)
        return await pins.list_all(caller, tenant)

    @app.delete("/v1/cache/pins/{pin_id}", responses=error_responses(401, 403, 404, 503))
    async def remove_pin(pin_id: str, caller: KeyGrant = authenticated) -> dict:
        """Release any namespace's pin by the id the listing gives (an admin key only)."""
        _require_ready(engine)
        return await pins.remove(caller, pin_id)

    install_worker_info(app, engine, model_name, max_model_len)

    if server_config.debug_endpoints:

        @app.get("/debug/cache", responses=error_responses(401, 403, 503))
        async def debug_cache(caller: KeyGrant = authenticated) -> dict:
            require_admin(caller, "/debug/cache")
            _require_ready(engine)
            return await engine.debug_cache()

    install_openapi(app)

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi_document(caller: KeyGrant = authenticated) -> dict[str, Any]:
        return app.openapi()

    return app


def _require_ready(engine: EngineClient) -> None:
    if not engine.health().get("ready"):
        raise EngineUnavailableError("the engine is starting or shutting down")
