"""Request bodies as strict JSON: what ``json.loads`` lets through that no endpoint can use.

Python's JSON reader accepts ``NaN``, ``Infinity`` and ``-Infinity`` (not JSON),
turns ``1e400`` into an infinite float, and keeps lone UTF-16 surrogates
(``"\\ud800"``) in strings, which cannot be encoded as UTF-8 and fail later,
deep inside tokenizers and templates. ``loads`` refuses all of them with a 400
naming where they are, so every field of every endpoint is checked once.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import sys
from collections import deque
from typing import Any

from starlette.requests import ClientDisconnect, Request

from edgeinfer.errors import (
    ClientClosed,
    InvalidRequest,
    PayloadTooLarge,
    RequestTimeout,
    UnsupportedMediaType,
)
from edgeinfer.prompt import nesting

_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class _NotANumber(str):
    """Where a body held NaN / Infinity or an out-of-range number (its text)."""


class _BadNumber(ValueError):
    pass


def _constant(name: str) -> Any:
    raise _BadNumber(name)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _BadNumber(text)
    return value


def _marked(text: str) -> float | _NotANumber:
    value = float(text)
    return value if math.isfinite(value) else _NotANumber(text[:40])


def _bad_number(data: bytes | bytearray | str) -> InvalidRequest:
    """The 400 for a body holding NaN, Infinity or an out-of-range number, naming the first
    field that holds one (the body is parsed again, keeping those as markers)."""
    try:
        value = json.loads(data, parse_constant=_NotANumber, parse_float=_marked)
    except (ValueError, RecursionError):  # the body also has a syntax error further on
        return InvalidRequest("the request body is not valid JSON (or nests too deeply)")
    todo: deque[tuple[Any, list[str | int]]] = deque([(value, [])])
    while todo:
        node, path = todo.popleft()
        if isinstance(node, _NotANumber):
            where = _where(path)
            what = (f"{node} is not a JSON number" if node in ("NaN", "Infinity", "-Infinity")
                    else f"the number {node} is out of range")
            return InvalidRequest(f"the request body is not valid JSON: {what} (at '{where}')",
                                  param=where if path else None)
        if isinstance(node, dict):
            todo.extend((v, [*path, k]) for k, v in node.items())
        elif isinstance(node, list):
            todo.extend((v, [*path, i]) for i, v in enumerate(node))
    return InvalidRequest("the request body is not valid JSON")


def _where(path: list[str | int]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out or "(body)"


def check_strings(value: Any) -> None:
    """400 for a lone surrogate anywhere in ``value`` (keys included)."""
    todo: list[tuple[Any, list[str | int]]] = [(value, [])]
    while todo:
        node, path = todo.pop()
        if isinstance(node, str):
            if _SURROGATE.search(node):
                where = _where(path)
                raise InvalidRequest(f"'{where}' holds a lone UTF-16 surrogate, which is not "
                                     "valid Unicode text", param=where if path else None)
        elif isinstance(node, dict):
            for k, v in node.items():
                if _SURROGATE.search(k):
                    raise InvalidRequest(f"a key in '{_where(path)}' holds a lone UTF-16 "
                                         "surrogate", param=_where(path) if path else None)
                todo.append((v, [*path, k]))
        elif isinstance(node, list):
            todo.extend((v, [*path, i]) for i, v in enumerate(node))


def loads(data: bytes | bytearray | str) -> Any:
    """Parse a request body; InvalidRequest (400) for anything that is not strict JSON or
    that nests more than ``nesting.MAX_DEPTH`` levels."""
    try:
        value = json.loads(data, parse_constant=_constant, parse_float=_float)
    except _BadNumber:
        raise _bad_number(data) from None
    except UnicodeDecodeError:
        raise InvalidRequest("the request body is not valid UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc.msg} at line "
                             f"{exc.lineno}, column {exc.colno}") from None
    except ValueError as exc:  # Python's limit on integer digits
        if "digits" not in str(exc):
            raise InvalidRequest("the request body is not valid JSON") from None
        raise InvalidRequest("the request body holds an integer of more than "
                             f"{sys.get_int_max_str_digits()} digits") from None
    except RecursionError:
        raise InvalidRequest("the request body nests too deeply") from None
    if not nesting.shallow(value):
        raise InvalidRequest(f"the request body nests more than {nesting.MAX_DEPTH} levels deep")
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if _SURROGATE_ESCAPE.search(raw):  # surrogates can only come from \uD800-\uDFFF escapes
        check_strings(value)
    return value


MAX_BODY_BYTES = 8 * 1024 * 1024
BODY_TIMEOUT = 60.0  # seconds for a whole request body to arrive
THREAD_PARSE_BYTES = 64 * 1024


async def read_bytes(request: Request) -> bytes:
    """The request's body, 413 past MAX_BODY_BYTES (declared or read), 408 when it takes
    more than the app's ``state.body_timeout`` seconds (default BODY_TIMEOUT) to arrive: a
    client trickling it would hold a connection."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit() and int(
            declared) > MAX_BODY_BYTES:
        raise PayloadTooLarge(f"request body exceeds {MAX_BODY_BYTES} bytes",
                              code="request_too_large")
    body = bytearray()
    app = request.scope.get("app")  # (an app mounted elsewhere, as on Ray Serve, has none)
    limit = getattr(getattr(app, "state", None), "body_timeout", BODY_TIMEOUT)
    try:
        async with asyncio.timeout(limit):
            async for part in request.stream():
                body += part
                if len(body) > MAX_BODY_BYTES:
                    raise PayloadTooLarge(f"request body exceeds {MAX_BODY_BYTES} bytes",
                                          code="request_too_large")
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {limit:g} s",
                             code="request_timeout") from None
    except ClientDisconnect:
        raise ClientClosed("the client closed the connection before sending its request "
                           "body", code="client_closed") from None
    return bytes(body)


async def read_json(request: Request) -> Any:
    """The request's body as strict JSON: 415 for another content type or an encoded
    body (``Content-Encoding``), 413 past
    MAX_BODY_BYTES (declared or read), 400 for anything ``loads`` refuses. A large body
    is parsed off the event loop."""
    ctype = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if ctype not in ("application/json", ""):
        raise UnsupportedMediaType(f"the request body must be application/json, not {ctype}",
                                   code="unsupported_media_type")
    coding = request.headers.get("content-encoding", "identity").strip().lower()
    if coding not in ("identity", ""):  # (gzip was read as text: "not valid UTF-8")
        raise UnsupportedMediaType(f"the request body must not be encoded ({coding}): send "
                                   "it as plain JSON", code="unsupported_media_type")
    body = await read_bytes(request)
    if len(body) > THREAD_PARSE_BYTES:
        return await asyncio.to_thread(loads, body)
    return loads(body)


async def read_json_any(request: Request) -> Any:
    """``read_json`` whatever the body's label, as Ollama and llama-server read bodies:
    ``curl -d`` labels JSON form data, litellm's async Ollama client octet-stream
    (cross-site browsers are kept out by the guard, which checks every request's origin)."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype not in ("application/json", ""):
        scope = {**request.scope, "headers": [
            (k, v) for k, v in request.scope["headers"] if k.lower() != b"content-type"]}
        request = Request(scope, request.receive)
    return await read_json(request)
