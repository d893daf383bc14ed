"""The front door (API keys, Host, CORS) as a unit on a tiny ASGI app."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from edgeinfer.api.guard import ASGIApp, front_door


async def ok_app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


def call(guard: ASGIApp, method: str, path: str, headers: dict[str, str]) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=guard)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8080") as c:
            return await c.request(method, path, headers=headers)
    return asyncio.run(go())


def test_api_keys() -> None:
    g = front_door(ok_app, api_keys=("sk-one", "sk-two"))
    assert call(g, "GET", "/v1/models", {}).status_code == 401
    assert call(g, "GET", "/v1/models", {"authorization": "Bearer sk-nope"}).status_code == 401
    assert call(g, "GET", "/v1/models", {"authorization": "Bearer sk-two"}).status_code == 200
    assert call(g, "GET", "/v1/models", {"x-api-key": "sk-one"}).status_code == 200
    assert call(g, "GET", "/health", {}).status_code == 200
    err = call(g, "POST", "/v1/chat/completions", {}).json()["error"]
    assert err["code"] == "invalid_api_key" and "sk-" not in err["message"]


@pytest.mark.parametrize(("host", "status"), [
    ("127.0.0.1:8080", 200), ("localhost", 200), ("[::1]:8080", 200),
    ("evil.example.com", 403), ("attacker.test:8080", 403), ("my.lan:8080", 200)])
def test_host_header_defeats_dns_rebinding(host: str, status: int) -> None:
    g = front_door(ok_app, allowed_hosts=("my.lan",))
    assert call(g, "GET", "/v1/models", {"host": host}).status_code == status


@pytest.mark.parametrize(("host", "status"), [
    ("host.docker.internal:8080", 200), ("gateway.docker.internal", 200), ("my-pc.local", 200),
    ("app.localhost:5173", 200), ("192.168.1.10", 200), ("10.0.0.5:8080", 200),
    ("[fd00::2]:8080", 200), ("[fe80::1]", 200), ("169.254.1.1", 200),
    ("0.0.0.0:8080", 403), ("[::]", 403), ("[::ffff:0.0.0.0]", 403), ("[::ffff:10.0.0.5]", 200),
    ("8.8.8.8", 403), ("localhost.evil.com", 403),
    ("evil.internal.example.com", 403), ("local", 403)])
def test_names_of_this_machine_or_network_are_served_on_loopback(host: str,
                                                                    status: int) -> None:
    """As Ollama: Open WebUI in Docker calls host.docker.internal; a LAN or mDNS name, or a
    private address, cannot be a rebinding page's Host. 0.0.0.0 (how a public page reaches
    localhost) and public names stay refused, saying where a name is allowed."""
    r = call(front_door(ok_app), "GET", "/v1/models", {"host": host})
    assert r.status_code == status, host
    if status == 403:
        assert "allowed_hosts" in r.json()["error"]["message"]


def test_a_wildcard_bind_serves_this_machines_own_addresses_and_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With --host 0.0.0.0 (and keys), LAN clients name the machine's address: that was a
    403 unless allowed_hosts listed it. A rebinding page's Host is its own domain: still
    refused; so is "0.0.0.0" itself, which no client names."""
    import socket
    from types import SimpleNamespace

    from edgeinfer.api import guard

    nics = {"eth0": [SimpleNamespace(family=socket.AF_INET, address="192.168.1.5"),
                     SimpleNamespace(family=socket.AF_INET6, address="fe80::1%eth0")]}
    monkeypatch.setattr(guard.psutil, "net_if_addrs", lambda: nics)
    monkeypatch.setattr(guard.socket, "gethostname", lambda: "Laptop")
    g = front_door(ok_app, allowed_hosts=guard.served_hosts("0.0.0.0"))
    for host, status in (("192.168.1.5:8080", 200), ("[fe80::1]:8080", 200),
                         ("laptop.local:8080", 200), ("laptop", 200), ("0.0.0.0", 403),
                         ("evil.example:8080", 403), ("192.168.1.6", 200)):
        assert call(g, "GET", "/v1/models", {"host": host}).status_code == status, host
    assert guard.served_hosts("fd00::2") == ("[fd00::2]",)  # (as a Host header writes it)
    assert guard.served_hosts("192.0.2.2") == ("192.0.2.2",)


def test_cors_allows_only_local_and_configured_origins() -> None:
    g = front_door(ok_app, cors_origins=("tauri://localhost",))
    r = call(g, "GET", "/v1/models", {"origin": "http://localhost:5173"})
    assert r.headers["access-control-allow-origin"] == "http://localhost:5173"
    r = call(g, "GET", "/v1/models", {"origin": "tauri://localhost"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "tauri://localhost"
    r = call(g, "POST", "/v1/chat/completions", {"origin": "https://evil.example.com"})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    pre = call(g, "OPTIONS", "/v1/chat/completions", {
        "origin": "http://127.0.0.1:3000", "access-control-request-method": "POST"})
    assert pre.status_code == 204 and "authorization" in pre.headers["access-control-allow-headers"]


@pytest.mark.parametrize(("origin", "status"), [
    ("tauri://localhost", 200), ("http://tauri.localhost", 200), ("app://.", 200),
    ("vscode-webview://1k3fa9", 200), ("vscode-file://vscode-app", 200),
    ("null", 403), ("chrome-extension://abcdef", 403), ("https://tauri.localhost.evil.com", 403),
    ("app://x/evil", 403), ("tauri://localhost@evil.com", 403), ("https://localhost.evil", 403)])
def test_desktop_apps_schemes_are_allowed_web_origins_are_not(origin: str, status: int) -> None:
    """As Ollama allows them by default: an app embedding the server works unconfigured;
    no web page can send these origins (a sandboxed frame sends "null", refused)."""
    r = call(front_door(ok_app), "POST", "/v1/chat/completions", {"origin": origin})
    assert r.status_code == status, origin


def test_preflight_allows_the_headers_an_sdk_sends_from_an_allowed_origin_only() -> None:
    g = front_door(ok_app, cors_origins=("app://desk",))
    asked = "x-api-key, anthropic-version, x-stainless-os, content-type"
    pre = call(g, "OPTIONS", "/v1/messages", {
        "origin": "app://desk", "access-control-request-method": "POST",
        "access-control-request-headers": asked})
    assert pre.status_code == 204 and pre.headers["access-control-allow-headers"] == asked
    pre = call(g, "OPTIONS", "/v1/messages", {
        "origin": "https://evil.example.com", "access-control-request-method": "POST",
        "access-control-request-headers": asked})
    assert pre.status_code == 403 and "access-control-allow-headers" not in pre.headers
