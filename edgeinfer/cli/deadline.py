"""A deadline for a request's headers: uvicorn's HTTP protocol, closing connections that
do not finish their request's headers in time.

uvicorn has no header timeout: a connection that sends half a request line and nothing
more (or sends nothing at all) is held open for good, so enough of them use up the
process's file descriptors and nobody else gets in (slowloris). With this protocol a
connection gets ``HEADER_TIMEOUT`` seconds from when it opens, or from the first bytes of
its next request, to complete that request's headers (``serve --header-timeout``);
otherwise it is closed, as nginx's ``client_header_timeout`` does. A request line and
headers larger than ``MAX_HEAD_BYTES`` get a 431 and the connection is closed. The body has its own
deadline (``api.body``, ``serve --body-timeout``). The process never holds more than
``max_connections`` open ones (``serve --max-connections``; by default the open-file limit
less a reserve), so it never runs out of file descriptors. At the cap a new connection
takes the place of the one that has waited longest without a request in progress (idle
keep-alive, or headers still coming, as nginx reuses idle keep-alive connections), else
of the one whose request body has been coming longest, so a client holding many idle or
trickling connections cannot lock others out; only when every connection has a complete
request being answered is the new one closed as it opens.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import resource
import socket
import struct
import time
from typing import Any, cast

from edgeinfer.api.errors import error_body
from edgeinfer.errors import InvalidRequest

log = logging.getLogger("edgeinfer.http")

HEADER_TIMEOUT = 30.0  # seconds to complete a request's headers (nginx: 60), by default
MAX_HEAD_BYTES = 64 * 1024  # a request line and headers (nginx: 4 x 8 KiB, Node.js: 16 KiB)
LINGER = 2.0  # seconds a refused connection's input is read and dropped before the close


class HeaderDeadline:
    """Mixed in before uvicorn's protocol class (httptools' or h11's): both keep the
    request being answered in ``cycle`` and start a new one when headers complete."""

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    cycle: Any
    header_timeout: float = HEADER_TIMEOUT
    max_connections: int = 1 << 30
    connections: set[Any]  # uvicorn's: every open connection of the server
    _deadline: asyncio.TimerHandle | None = None
    _waited_on: Any = None  # the cycle in place when the deadline was armed
    _waiting_since: float = 0.0  # when it began to wait for its next request's headers
    _head_bytes = 0  # bytes received since then, while its headers are not complete
    _discarding = False  # refused (431): what comes in is dropped until the close
    _tail = b""  # the last bytes of a head coming in (its blank line may be split)
    _parser_events = False  # httptools: the parser's message callbacks pass through here
    _in_body = False  # (httptools) the parser is inside a request's body
    _completed = False  # (httptools) a request's message ended in the read being parsed
    _refuse_pending = False  # a pipelined head passed the limit: 431 once the answer ends

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(cast(asyncio.Transport, Abandoning(transport, self)))  # type: ignore[misc]
        if len(self.connections) > self.max_connections:
            idle = self._longest_idle()
            if idle is None:
                _refused(self.max_connections)
                transport.close()
                return
            _evicted(self.max_connections)
            idle.transport.close()
        self._arm()

    def _idle(self) -> bool:
        """No request in progress: between requests or its headers not complete."""
        return self.cycle is None or self.cycle.response_complete

    def _heading(self) -> bool:
        """What comes in is a next request's head. With httptools: unless the parser is
        inside a body, even while the request before is still answered (the parser reads a
        pipelined head at once, so it is counted as it comes). With h11 (which holds a
        pipelined head in its own bounded buffer): idle, and no answered request's body
        still coming."""
        if self._parser_events:
            return not self._in_body
        return self._idle() and not (self.cycle is not None and self.cycle.more_body)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()  # type: ignore[misc]
        self._in_body = True  # until on_message_complete, at once for a request without
        cycle = self.cycle  # (httptools': h11 frames an HTTP/1.0 answer itself)
        if self._parser_events and cycle is not None and cycle.scope.get("http_version") == "1.0":
            close_delimited(cycle)

    def on_message_complete(self) -> None:
        self._in_body = False  # uvicorn's own flag stays unset for an answered request
        self._completed = True
        super().on_message_complete()  # type: ignore[misc]

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if self._refuse_pending and self._idle() and not self.transport.is_closing():
            self._refuse_pending = False
            self._send_431()

    def _longest_idle(self) -> HeaderDeadline | None:
        """The connection to close for a new one: an idle one (one that never completed a
        request, silent or its headers still coming, before a keep-alive one), else one
        whose request body is still coming; the longest waiting first. None: every
        connection's request is complete and being answered."""
        others = [c for c in self.connections if c is not self and isinstance(
            c, HeaderDeadline) and not c.transport.is_closing()]
        idle = [c for c in others if c._idle()]
        if idle:
            return min(idle, key=lambda c: (c.cycle is not None, c._waiting_since))
        sending = [c for c in others if c.cycle is not None and c.cycle.more_body]
        return min(sending, key=lambda c: c._waiting_since, default=None)

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            return
        heading = self._heading()
        if heading and self._head_past_limit(data):
            self._refuse_head()
            return
        self._completed = False
        super().data_received(data)  # type: ignore[misc]
        if not self._heading() or not heading or self._completed:
            # a request, or the rest of a body, or a request that ended in this read: what
            # follows its end in the same read is not counted (one read at most)
            self._head_bytes, self._tail = 0, b""
            return
        if self.transport.is_closing():
            return
        self._head_bytes += len(data)
        if self._head_bytes > MAX_HEAD_BYTES:
            self._refuse_head()
        elif self._deadline is None or self._waited_on is not self.cycle:
            self._arm()  # the first bytes of a next request, not yet complete

    def _head_past_limit(self, data: bytes) -> bool:
        """Whether the head of the request coming in passes MAX_HEAD_BYTES with ``data``:
        counted before the parser sees it (a head that arrives whole in one read would
        otherwise be complete, and pass, before it is counted)."""
        lead = 0  # blank lines before a request, which the parser skips
        if not self._head_bytes and not self._tail:
            lead = len(data) - len(data.lstrip(b"\r\n"))
        seen = self._tail + data[lead:]
        ends = [i + n for i, n in ((seen.find(b"\r\n\r\n"), 4), (seen.find(b"\n\n"), 2))
                if i >= 0]
        head = len(data) - lead if not ends else max(0, min(ends) - len(self._tail))
        self._tail = seen[-3:]
        return self._head_bytes + head > MAX_HEAD_BYTES

    def _refuse_head(self) -> None:
        """431 for a request line and headers past MAX_HEAD_BYTES (uvicorn's httptools
        protocol has no such limit: a 64 MB header line was read whole). What the client
        still sends is dropped from now on; the 431 goes out once no request is being
        answered (a pipelined head waits for the answer before it)."""
        self._discarding = True
        if self._idle():
            self._send_431()
        else:
            self._refuse_pending = True

    def _send_431(self) -> None:
        """Write the 431; read and drop what still comes for LINGER seconds, then close
        (closed at once, its unread bytes would reset the connection before the client
        reads the answer)."""
        log.info("closed a connection whose request headers passed %d bytes", MAX_HEAD_BYTES)
        body = error_body(InvalidRequest(
            f"the request line and headers exceed {MAX_HEAD_BYTES} bytes",
            code="request_header_fields_too_large"))
        self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                             b"content-type: application/json\r\nconnection: close\r\n"
                             b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER, self.transport.close)

    def send_400_response(self, msg: str) -> None:
        """A request the HTTP parser cannot read (bad framing, an unknown method, TLS on
        plain HTTP): 400 in the OpenAI error shape, where httptools' protocol wrote plain
        text; then the close, as uvicorn does (h11's protocol answers in its own way)."""
        if not self._parser_events:
            super().send_400_response(msg)  # type: ignore[misc]
            return
        body = error_body(InvalidRequest(f"invalid HTTP request: {msg}",
                                         code="invalid_http_request"))
        self.transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
                             b"connection: close\r\ncontent-length: " + str(len(body)).encode()
                             + b"\r\n\r\n" + body)
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._waited_on = self.cycle
        self._waiting_since = self.loop.time()
        self._deadline = self.loop.call_later(self.header_timeout, self._expire)

    def _expire(self) -> None:
        self._deadline = None
        if self.cycle is not self._waited_on:  # its headers completed: a request began
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return
        if not self.transport.is_closing():
            log.info("closed a connection that sent no complete request headers in %g s",
                     self.header_timeout)
            self.transport.close()


class Abandoning:
    """A connection's transport as uvicorn's protocol and request cycles use it, whose
    close, while a response is incomplete and bytes wait to be sent, resets the
    connection. uvicorn closes the transport so when the app ends a stream its client
    stopped reading (``send_timeout``): a close waits for the client to read what is
    buffered, that is for as long as it stays connected (a suspended laptop: for good),
    holding the socket and its buffers, and a shutdown waits for it. A complete response
    is closed as before, sent whole. (The protocol's ``cycle`` is the newest request's:
    with a request pipelined behind the stream, that one, not begun, is incomplete too.)"""

    def __init__(self, transport: asyncio.Transport, protocol: Any) -> None:
        self._transport, self._protocol = transport, protocol
        self.write, self.is_closing = transport.write, transport.is_closing

    def close(self) -> None:
        cycle = self._protocol.cycle
        if cycle is None or cycle.response_complete or not self._transport.get_write_buffer_size():
            self._transport.close()
            return
        sock = self._transport.get_extra_info("socket")
        with contextlib.suppress(OSError, AttributeError, TypeError):  # a reset, not a linger
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


UNBOUNDED = 1 << 62


def close_delimited(cycle: Any) -> None:
    """An HTTP/1.0 request's answer framed as HTTP/1.0 frames it: a body of no given
    length runs until the connection closes. uvicorn's httptools protocol sent it in
    chunks, which HTTP/1.0 does not have (RFC 9112 6.1: a client of 1.0 reads the chunk
    sizes as text), and sse-starlette's ``Connection: keep-alive`` beside its ``close``."""
    send = cycle.send

    async def framed(message: Any) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [
                (k, v) for k, v in message.get("headers", ()) if k.lower() != b"connection"]}
            if not any(k.lower() in (b"content-length", b"transfer-encoding")
                       for k, _ in message["headers"]):
                cycle.chunked_encoding, cycle.expected_content_length = False, UNBOUNDED
        elif cycle.chunked_encoding is False and cycle.expected_content_length > UNBOUNDED // 2 \
                and not message.get("more_body", False):
            cycle.expected_content_length = len(message.get("body", b""))  # (the last part)
        await send(message)
    cycle.send = framed


_last_logged = {"refused": 0.0, "evicted": 0.0}


def _once_a_minute(what: str, message: str, cap: int) -> None:
    now = time.monotonic()
    if now - _last_logged[what] >= 60:
        _last_logged[what] = now
        log.warning(message, cap)


def _refused(cap: int) -> None:
    _once_a_minute("refused", "refusing connections past %d open ones, all being answered "
                   "(--max-connections)", cap)


def _evicted(cap: int) -> None:
    _once_a_minute("evicted", "at %d open connections (--max-connections): closing the "
                   "longest idle one (or slowest upload) for each new one", cap)


def default_max_connections() -> int:
    """Open connections allowed: the process's open-file limit less 128 for everything
    else (model files, logs, the store), at least 64."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(64, (soft if soft != resource.RLIM_INFINITY else 1 << 20) - 128)


def protocol_class(header_timeout: float = HEADER_TIMEOUT,
                   max_connections: int | None = None) -> type:
    """uvicorn's HTTP protocol ("auto": httptools when installed, else h11) with a header
    deadline of ``header_timeout`` seconds, closing connections past ``max_connections``
    open ones at once (default ``default_max_connections``)."""
    base: type
    if importlib.util.find_spec("httptools") is not None:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
        base = HttpToolsProtocol
    else:
        from uvicorn.protocols.http.h11_impl import H11Protocol
        base = H11Protocol
    return type(f"Deadline{base.__name__}", (HeaderDeadline, base), {
        "header_timeout": header_timeout,
        "_parser_events": base.__name__ == "HttpToolsProtocol",
        "max_connections": max_connections or default_max_connections()})
