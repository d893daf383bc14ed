"""The one error shaper: every error a client sees, as OpenAI's ``{"error": {...}}``."""

from __future__ import annotations

import json
import logging

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edgeinfer.errors import APIError, MethodNotAllowed, NotFound, ServerError

log = logging.getLogger("edgeinfer.api")


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.to_dict(), status_code=exc.status, headers=exc.headers)


def error_body(exc: APIError) -> bytes:
    """The JSON body of an error, for ASGI code that sends its own response."""
    return json.dumps(exc.to_dict()).encode()


async def on_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return error_response(exc)


async def on_http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 / 405 (no route, wrong method) in the same shape."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        return error_response(MethodNotAllowed(str(exc.detail), code="method_not_allowed"))
    if exc.status_code == 404:
        return error_response(NotFound(f"no route for {request.method} {request.url.path}",
                                       code="not_found"))
    err = ServerError(str(exc.detail))
    return JSONResponse(err.to_dict(), status_code=exc.status_code)


async def on_internal_error(request: Request, exc: Exception) -> Response:
    log.exception("internal error on %s", request.url.path, exc_info=exc)
    return error_response(ServerError("internal server error", code="internal_error"))
