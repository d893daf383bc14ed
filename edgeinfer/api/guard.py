"""The front door: Host header (DNS rebinding), CORS and API keys, one ASGI middleware each.

- API keys (optional): ``Authorization: Bearer KEY`` or ``x-api-key: KEY``, compared
  in constant time, never logged. The probes ``GET /health`` and ``GET /ready`` stay open
  (a kubelet or load balancer sends no key), and ``/metrics`` with ``open_metrics``.
- Host: the Host header must name a loopback address, this machine or network
  (``local_name``) or a configured host, so a page on another site that rebinds its DNS
  name to 127.0.0.1 gets nothing.
- CORS: browsers may call from localhost origins and configured ones (a desktop
  app's ``tauri://localhost``, ``app://...``); other origins get no CORS headers,
  and their requests are refused outright.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import psutil
from starlette.requests import Request

from edgeinfer.api.errors import dialect_path, error_body
from edgeinfer.errors import APIError, AuthenticationFailed, InvalidRequest, PermissionDenied

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
_LOCAL_ORIGIN = re.compile(r"^https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?$")
# desktop apps' own schemes, which no web page can have (as Ollama allows them by default):
# Tauri (tauri://localhost; http(s)://tauri.localhost on Windows), Electron's app://, VS
# Code webviews. Not "null" (a sandboxed frame of any site sends it), nor extensions.
_APP_ORIGIN = re.compile(r"^((tauri|app|vscode-webview|vscode-file)://[\w.:-]*"
                         r"|https?://tauri\.localhost(:\d+)?)$")
# the probes; the chat page holds no data (it asks for a key)
OPEN_PATHS = frozenset({"/health", "/v1/health", "/ready", "/"})


# RFC 9110 Host: a name or IPv4 address, or an IPv6 address in brackets, then an optional
# numeric port. Anything else (userinfo, paths, spaces, two ports) is not a host.
_HOST = re.compile(r"(\[[0-9a-f:.]+\]|[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?)(?::\d{1,5})?")


def _host_only(host: str) -> str | None:
    """The host part of a Host header, or None when the header is malformed."""
    m = _HOST.fullmatch(host.strip().lower())
    return m.group(1) if m else None


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


WILDCARD_HOSTS = ("0.0.0.0", "::", "")  # binds that listen on every address


def served_hosts(host: str) -> tuple[str, ...]:
    """What a Host header may name besides loopback and ``allowed_hosts``: the bound
    address, and for a wildcard bind (0.0.0.0, ::) this machine's own addresses and name,
    which LAN clients use (a rebinding page's Host is its own domain, never these)."""
    if host not in WILDCARD_HOSTS:
        return (f"[{host}]" if ":" in host else host,)
    name = socket.gethostname().lower()
    out = {name, f"{name}.local"}
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            ip = a.address.split("%")[0].lower()  # (an IPv6 address's zone: not in a Host)
            if a.family in (socket.AF_INET, socket.AF_INET6):
                out.add(f"[{ip}]" if a.family == socket.AF_INET6 else ip)
    return tuple(sorted(out))


_LOCAL_SUFFIXES = (".localhost", ".local", ".internal")


def local_name(host: str) -> bool:
    """Whether ``host`` (a Host header's host part) is one no DNS-rebinding page can have,
    as Ollama allows them: an IP address in a private, loopback or link-local range (a
    rebinding page's Host is its own domain name; the unspecified 0.0.0.0 stays refused,
    which a public page can reach localhost by), a name under .localhost (RFC 6761: always
    this machine), .local (mDNS: this network) or .internal (private use: Docker's
    host.docker.internal), and this machine's own name."""
    try:
        ip = ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return host.endswith(_LOCAL_SUFFIXES) or host == socket.gethostname().lower()
    ip = getattr(ip, "ipv4_mapped", None) or ip  # [::ffff:0.0.0.0] is 0.0.0.0
    return not ip.is_unspecified and (ip.is_private or ip.is_loopback or ip.is_link_local)


class HostGuard:
    """The Host header must name a loopback address, a name or address of this machine or
    network (``local_name``) or a configured host ("*": any); a malformed one is refused
    either way. 403 ``invalid_host`` otherwise; 400 when an
    HTTP/1.1 request has none or several (an HTTP/1.0 one without: served)."""

    def __init__(self, app: ASGIApp, allowed_hosts: tuple[str, ...] = ()) -> None:
        self.app = app
        self.any_host = "*" in allowed_hosts
        self.hosts = LOOPBACK_HOSTS | {h.lower() for h in allowed_hosts}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if sum(k == b"host" for k, _ in scope["headers"]) > 1:  # RFC 9112 3.2: 400 (a
                await _deny(scope, send, InvalidRequest(  # proxy may route on another one)
                    "more than one Host header", code="invalid_host"))
                return
            given = _headers(scope).get("host")
            if given is None and scope.get("http_version") != "1.0":  # RFC 9112 3.2
                await _deny(scope, send, InvalidRequest(
                    "an HTTP/1.1 request needs a Host header", code="invalid_host"))
                return
            # HTTP/1.0 may leave it out (no browser does: rebinding pages cannot)
            host = _host_only(given) if given is not None else "localhost"
            if host is None or not (self.any_host or host in self.hosts or local_name(host)):
                await _deny(scope, send, PermissionDenied(
                    "the Host header names an address this server does not serve (a "
                    "name it should serve goes in [server] allowed_hosts of models.toml)",
                    code="invalid_host"))
                return
        await self.app(scope, receive, send)


class CorsGuard:
    """Browsers may call from localhost origins, desktop apps' schemes (``_APP_ORIGIN``)
    and ``cors_origins``: those get CORS headers
    (and preflights an answer); any other origin is refused outright with 403. Starlette's
    CORSMiddleware only leaves the headers out, letting the request itself run."""

    def __init__(self, app: ASGIApp, cors_origins: tuple[str, ...] = ()) -> None:
        self.app = app
        self.origins = frozenset(cors_origins)

    def origin_allowed(self, origin: str) -> bool:
        return origin in self.origins or bool(_LOCAL_ORIGIN.match(origin)
                                              or _APP_ORIGIN.match(origin))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = _headers(scope) if scope["type"] == "http" else {}
        origin = headers.get("origin")
        if origin is None:
            await self.app(scope, receive, send)
            return
        if not self.origin_allowed(origin):
            await _deny(scope, send, PermissionDenied(
                "cross-origin requests from this origin are not allowed",
                code="origin_not_allowed"))
            return
        cors = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            await send({"type": "http.response.start", "status": 204, "headers": cors + [
                (b"access-control-allow-methods", b"GET, POST, DELETE, OPTIONS"),
                # an allowed origin may send what its client library sends (the SDKs'
                # x-stainless-*, anthropic-version, ...): echo what the preflight asks for
                (b"access-control-allow-headers", headers.get(
                    "access-control-request-headers",
                    "authorization, content-type, x-api-key, anthropic-version").encode("latin-1")),
                (b"access-control-max-age", b"600")]})
            await send({"type": "http.response.body", "body": b""})
            return

        async def send_with_cors(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = list(message.get("headers", [])) + cors
            await send(message)

        await self.app(scope, receive, send_with_cors)


class ApiKeyGuard:
    """With keys configured, every path but ``open_paths`` needs one (401 otherwise)."""

    def __init__(self, app: ASGIApp, api_keys: tuple[str, ...] = (),
                 open_paths: frozenset[str] = OPEN_PATHS) -> None:
        self.app = app
        self.keys = tuple(k.encode() for k in api_keys if k)
        self.open_paths = open_paths

    def key_ok(self, headers: dict[str, str]) -> bool:
        given = headers.get("x-api-key", "")
        auth = headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            given = auth[7:].strip()
        if not given:
            return False
        ok = False
        for key in self.keys:  # check every key: timing says nothing about which matched
            ok |= hmac.compare_digest(given.encode(), key)
        return ok

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (self.keys and scope["type"] == "http" and scope["path"] not in self.open_paths
                and not self.key_ok(_headers(scope))):
            await _deny(scope, send, AuthenticationFailed(
                "a valid API key is required (Authorization: Bearer KEY or x-api-key: KEY)",
                code="invalid_api_key"))
            return
        await self.app(scope, receive, send)


def key_owner(request: Request) -> str:
    """Whose stored objects (responses, chat completions) these are: on a server with API
    keys, the SHA-256 of the key the request gave (the bearer token, else x-api-key, as the
    guard reads it); on a server without keys, everybody's ("": any local client reads what
    another stored)."""
    if not request.app.state.pool.config.api_keys:
        return ""
    headers = request.headers
    auth = headers.get("authorization", "")
    key = auth[7:].strip() if auth[:7].lower() == "bearer " else headers.get("x-api-key", "")
    return hashlib.sha256(key.encode()).hexdigest() if key else ""


def front_door(app: ASGIApp, *, api_keys: tuple[str, ...] = (),
               allowed_hosts: tuple[str, ...] = (),
               cors_origins: tuple[str, ...] = ()) -> ASGIApp:
    """``app`` behind the three guards, outermost first: Host, CORS, API key."""
    return HostGuard(CorsGuard(ApiKeyGuard(app, api_keys), cors_origins), allowed_hosts)


async def _deny(scope: Scope, send: Send, err: APIError) -> None:
    body = error_body(err, dialect_path(str(scope.get("path", "")), _headers(scope)))
    await send({"type": "http.response.start", "status": err.status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
