"""The one error shaper: every error a client sees, in the shape of the dialect it spoke.

OpenAI's ``{"error": {"message", "type", "param", "code"}}`` everywhere, except under
Anthropic's Messages routes (``{"type": "error", "error": {"type", "message"}}``) and
Ollama's ``/api/`` routes (``{"error": "message"}``): a client library reads errors in
its own API's shape. The status is the same for all.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edgeinfer.errors import (
    APIError,
    ContextTooLong,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    ServerError,
)

log = logging.getLogger("edgeinfer.api")

ANTHROPIC_PREFIX = "/v1/messages"
OLLAMA_PREFIX = "/api/"

# Anthropic's error types, by status (https://docs.anthropic.com/en/api/errors)
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                    403: "permission_error", 404: "not_found_error",
                    405: "invalid_request_error", 408: "timeout_error",
                    409: "invalid_request_error",
                    413: "request_too_large", 415: "invalid_request_error",
                    429: "rate_limit_error", 503: "overloaded_error", 504: "timeout_error"}


def shape(exc: APIError, path: str = "") -> dict[str, Any]:
    """The JSON body of ``exc`` for a request to ``path``."""
    if _anthropic(path):
        details = {"details": exc.details} if exc.details is not None else {}
        message = exc.anthropic_message if isinstance(exc, ContextTooLong) else exc.message
        return {"type": "error", "error": {
            "type": _ANTHROPIC_TYPES.get(exc.status, "api_error"), "message": message,
            **details}}
    if path.startswith(OLLAMA_PREFIX):
        return {"error": exc.message}
    return exc.to_dict()


def _anthropic(path: str) -> bool:
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")


def error_response(exc: APIError, path: str = "") -> JSONResponse:
    """``exc`` in the shape of ``path``'s dialect; Anthropic's overloaded_error is 529."""
    status = 529 if exc.status == 503 and _anthropic(path) else exc.status
    headers = exc.headers
    if status == 504:  # a time limit: the same request would run into it again
        headers = {**headers, "x-should-retry": "false"}  # (the SDKs retry 5xx otherwise)
    return JSONResponse(shape(exc, path), status_code=status, headers=headers)


def error_body(exc: APIError, path: str = "") -> bytes:
    """The JSON body of an error, for ASGI code that sends its own response."""
    return json.dumps(shape(exc, path)).encode()


def dialect_path(path: str, headers: Mapping[str, str]) -> str:
    """The path whose dialect shapes an error: any /v1/ path answers Anthropic's SDK (which
    sends ``anthropic-version``) in Anthropic's shape (the model routes it shares, routes
    this server lacks such as /v1/files, a missing API key)."""
    if path.startswith("/v1/") and "anthropic-version" in headers:
        return ANTHROPIC_PREFIX
    return path


def _dialect_path(request: Request) -> str:
    return dialect_path(request.url.path, request.headers)


async def on_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return error_response(exc, _dialect_path(request))


async def on_http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 / 405 (no route, wrong method) in the same shape."""
    assert isinstance(exc, HTTPException)
    path = _dialect_path(request)
    if exc.status_code == 405:
        return error_response(MethodNotAllowed(  # (with Starlette's Allow header)
            str(exc.detail), code="method_not_allowed", headers=dict(exc.headers or {})), path)
    if exc.status_code == 404:
        return error_response(NotFound(f"no route for {request.method} {request.url.path}",
                                       code="not_found"), path)
    err = ServerError(str(exc.detail))
    return JSONResponse(shape(err, path), status_code=exc.status_code)


async def on_internal_error(request: Request, exc: Exception) -> Response:
    if isinstance(exc, RecursionError):  # a value nested past what some step recurses
        log.warning("request on %s nests too deeply: %s", request.url.path, exc)
        return error_response(InvalidRequest("the request nests too deeply to process"),
                              _dialect_path(request))
    log.exception("internal error on %s", request.url.path, exc_info=exc)
    return error_response(ServerError("internal server error", code="internal_error"),
                          _dialect_path(request))
