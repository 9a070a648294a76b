"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, and the
exception handlers that make every failure one of them.

Nothing a client sends may produce FastAPI's default 422 `{"detail": ...}` or a 500: request
problems are `APIError`s (4xx), engine states are 429/503, and the catch-all 500 is a last
resort that logs the traceback (a 5xx other than 503 is a bug).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tieredkv.engine.protocol import EngineUnavailableError, QueueFullError
from tieredkv.errors import RequestError

log = logging.getLogger(__name__)

INVALID_REQUEST = "invalid_request_error"
QUEUE_RETRY_AFTER_S = 1  # Retry-After of a 429 for a full queue
# a request whose body stopped arriving: the connection would wait for the rest, so the answer
# closes it (a 413's body is still read and dropped by the server, keeping the client's writes
# from being reset before it reads the answer)
CLOSING_STATUSES = frozenset({408})


class APIError(Exception):
    """An HTTP error to send in OpenAI's shape."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s  # sent as Retry-After

    def payload(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    @property
    def closes_connection(self) -> bool:
        return self.status in CLOSING_STATUSES

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else {}
        if self.closes_connection:
            headers["Connection"] = "close"
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(self.retry_after_s)
        return JSONResponse(self.payload(), status_code=self.status, headers=headers or None)


class ClientGone(Exception):
    """The client hung up before its answer was ready; nobody reads the reply."""


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, INVALID_REQUEST, param, code)


def from_exception(exc: BaseException) -> APIError:
    """The APIError for an exception the server knows how to report; 500 otherwise."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, RequestError):
        return bad_request(str(exc), exc.param, exc.code)
    if isinstance(exc, ClientGone):
        return bad_request("the client closed the request", None, "client_closed_request")
    if isinstance(exc, QueueFullError):
        message = f"the server's queue is full, retry later ({exc})"
        # the queue admits as requests finish: a second is a fair first wait
        return APIError(429, message, "rate_limit_error", None, "queue_full", QUEUE_RETRY_AFTER_S)
    if isinstance(exc, EngineUnavailableError):
        message = (
            f"the engine is not available: {exc}" if str(exc) else "the engine is not available"
        )
        return APIError(503, message, "server_error", None, "service_unavailable")
    return APIError(500, "internal server error", "server_error", None, "internal_error")


def _status_error(request: Request, exc: StarletteHTTPException) -> APIError:
    route = f"{request.method} {request.url.path}"
    if exc.status_code == 404:
        # The contract gives unknown routes the same 404 shape as unknown models.
        return APIError(404, f"no such route: {route}", INVALID_REQUEST, None, "model_not_found")
    if exc.status_code == 405:
        return APIError(
            405, f"method not allowed: {route}", INVALID_REQUEST, None, "method_not_allowed"
        )
    return APIError(exc.status_code, str(exc.detail), INVALID_REQUEST)


def install_error_handlers(app: FastAPI) -> None:
    """Route every exception through OpenAI's error shape."""

    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        return from_exception(exc).response()

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException), type(exc)
        response = _status_error(request, exc).response()
        if exc.status_code == 405 and exc.headers:
            response.headers.update(exc.headers)  # Allow: the methods the route takes
        return response

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        # Bodies are validated by our own code; this covers path/query parameters.
        assert isinstance(exc, RequestValidationError), type(exc)
        errors = exc.errors()
        loc = errors[0].get("loc", ()) if errors else ()
        param = ".".join(str(p) for p in loc[1:]) or None
        message = errors[0].get("msg", "invalid request") if errors else "invalid request"
        return bad_request(message, param).response()

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        app.state.internal_errors += 1
        return from_exception(exc).response()

    app.state.internal_errors = 0
    for cls in (APIError, ClientGone, RequestError, QueueFullError, EngineUnavailableError):
        app.add_exception_handler(cls, on_api_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(Exception, on_unexpected)
