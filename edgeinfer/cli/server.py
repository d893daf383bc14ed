"""Running the app under uvicorn: graceful shutdown, start-up summary, ready signal.

For desktop apps that start edgeinfer as their backend: ``--port 0`` picks a
free port; once the server answers, one line goes to stdout::

    EDGEINFER_READY {"url": "http://127.0.0.1:54321", "pid": 4242}

(and the same JSON to ``--ready-file`` if given); ``--parent-pid`` makes the
server shut down when that process is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import json
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import uvicorn
from sse_starlette.sse import AppStatus

from edgeinfer import __version__
from edgeinfer.api.guard import WILDCARD_HOSTS
from edgeinfer.errors import ConfigError
from edgeinfer.models.partial import partial_name
from edgeinfer.models.pool import ModelState

log = logging.getLogger("edgeinfer")

READY_PREFIX = "EDGEINFER_READY "
FORCED_EXIT_SECONDS = 5.0  # after a second signal, the process ends within this, stuck or not


def announce_ready(info: dict[str, Any], ready_file: Path | None) -> bool:
    """The READY line on stdout, after the same JSON in ``ready_file`` if given (whole,
    never half-written: a draft of this writer's own name, ``models.partial``'s, renamed
    into place; another process's draft is not taken for it). Whether ``ready_file`` was
    written (a failure is logged: its folder was tried at start, but may have changed)."""
    ready, written = json.dumps(info), False
    if ready_file is not None:
        tmp = partial_name(ready_file, "tmp")
        try:
            tmp.write_text(ready + "\n", encoding="utf-8")
            tmp.replace(ready_file)
            written = True
        except OSError as exc:
            log.error("cannot write the ready file %s: %s", ready_file, exc)
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)  # (a draft half-written)
    sys.stdout.write(READY_PREFIX + ready + "\n")
    sys.stdout.flush()
    return written


def _not_cancelled(record: logging.LogRecord) -> bool:
    """A log filter: records about a task cancelled at a forced exit are dropped (uvicorn
    logs the ASGI tasks' and the lifespan's, the latter as traceback text)."""
    exc = record.exc_info[1] if record.exc_info else None
    return not isinstance(exc, asyncio.CancelledError) and \
        "CancelledError" not in record.getMessage()


def bind(host: str, port: int) -> list[socket.socket]:
    """The listening sockets, bound before any model loads, so a port in use is a one-line
    error at once rather than after minutes of loading. As asyncio binds them: every
    address ``host`` resolves to ("localhost": 127.0.0.1 and ::1), IPv6 ones IPv6-only;
    port 0 picks one free port for all."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"cannot listen on {host}: {exc.strerror}") from None
    socks: list[socket.socket] = []
    for family, kind, proto, _, addr in dict.fromkeys(infos):
        sock = socket.socket(family, kind, proto)
        socks.append(sock)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            sock.bind((addr[0], port, *addr[2:]))
        except OSError as exc:
            for s in socks:
                s.close()
            raise ConfigError(f"cannot listen on {addr[0]}:{port}: {exc.strerror or exc} "
                              "(another server there? choose another --port)") from None
        port = port or sock.getsockname()[1]
    return socks


def _summary(app: Any, url: str) -> str:
    pool = app.state.pool
    lines = [f"edgeinfer {__version__} ready at {url}/v1  (chat page: {url}/)"]
    for served in pool.models.values():
        info, cfg = served.runtime.info, served.cfg
        where = f"GPU ({cfg.gpu_layers} layers)" if cfg.gpu_layers else "CPU"
        aliases = f" ({', '.join(cfg.aliases)})" if cfg.aliases else ""
        lines.append(f"  {cfg.id}{aliases}: {info.description}, {where}, {cfg.slots} slots, "
                     f"{info.n_ctx} KV cells{'' if 'context' in cfg.explicit else ' (fit)'}, "
                     f"{cfg.threads} threads, "
                     f"~{served.runtime.memory_bytes() >> 20} MiB of weights and KV cache")
    for mid, err in pool.failed.items():
        lines.append(f"  {mid}: FAILED - {err}")
    for mid, entry in pool.entries.items():
        if entry.state is ModelState.LOADING:  # --serve-while-loading: /ready says when
            lines.append(f"  {mid}: loading")
    key = " -H 'authorization: Bearer <your key>'" if pool.config.api_keys else ""
    name = "default" if pool.knows("default") else next(iter(pool.entries), "default")
    body = json.dumps({"model": name, "messages": [{"role": "user", "content": "Hi"}]})
    lines.append(f"  try: curl {url}/v1/chat/completions{key} "
                 f"-H 'content-type: application/json' -d '{body}'")
    return "\n".join(lines)


def _alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:  # gone (NoSuchProcess) or not ours to see
        return False


class OneLineStartupFailure:
    """The app, whose start-up failure on edgeinfer's own errors (a model file missing,
    no memory for it) uvicorn reports as their one line, not a traceback."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.state = app.state

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def quiet(message: Any) -> None:
            text = message.get("message") or ""
            last = text.rstrip().rsplit("\n", 1)[-1]
            if message["type"] == "lifespan.startup.failed" and last.startswith(
                    "edgeinfer.errors."):
                message = {**message, "message": "start-up failed: " + last.split(": ", 1)[-1]}
            await send(message)

        await self.app(scope, receive, quiet)


class EdgeServer(uvicorn.Server):
    """uvicorn's server with edgeinfer's shutdown and start-up behaviour.

    First SIGTERM/SIGINT/SIGHUP (a closed terminal; unless ignored, as under ``nohup``):
    /ready answers 503 (draining); after ``drain_delay`` seconds of serving as before (0:
    at once), stop accepting, let running requests finish for ``grace`` seconds, then end
    the rest with an error event; exit status 0. Second signal: exit now. A fatal signal
    (SIGBUS, SIGSEGV, ...) writes every thread's traceback to stderr (``faulthandler``).
    """

    def __init__(self, config: uvicorn.Config, app: Any, grace: float,
                 ready_file: Path | None = None, parent_pid: int | None = None,
                 drain_delay: float = 0.0) -> None:
        super().__init__(config)
        self.app = app
        self.grace = grace
        self.drain_delay = drain_delay
        self._signalled = False
        self.ready_file = ready_file
        self.parent_pid = parent_pid
        # sse-starlette would cut every stream at the first signal; we drain instead
        AppStatus.disable_automatic_graceful_drain()  # type: ignore[no-untyped-call]

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's (SIGINT, SIGTERM), and SIGHUP unless it is ignored; and faulthandler."""
        hup = threading.current_thread() is threading.main_thread() and hasattr(
            signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN
        before = signal.signal(signal.SIGHUP, self.handle_exit) if hup else None
        try:
            with contextlib.suppress(ValueError, OSError, AttributeError):  # (no stderr file)
                faulthandler.enable()
            with super().capture_signals():
                yield
        finally:
            if before is not None:  # (None: a handler not set from Python, left as it is)
                signal.signal(signal.SIGHUP, before)

    async def startup(self, sockets: Any = None) -> None:
        if self.parent_pid is not None:  # (from the start: loading may take minutes)
            threading.Thread(target=self._watch_parent, daemon=True, name="parent").start()
        await super().startup(sockets)
        if not self.started or not self.servers:
            return
        host, port = self.servers[0].sockets[0].getsockname()[:2]
        shown = self.config.host if self.config.host not in WILDCARD_HOSTS else host
        shown = f"[{shown}]" if ":" in shown else shown
        url = f"http://{shown}:{port}"
        log.info("%s", _summary(self.app, url))
        announce_ready({"url": url, "pid": os.getpid()}, self.ready_file)

    async def shutdown(self, sockets: Any = None) -> None:
        await super().shutdown(sockets)
        if self.ready_file is not None:
            self.ready_file.unlink(missing_ok=True)

    def _watch_parent(self) -> None:
        while not self.should_exit:
            if not _alive(self.parent_pid or 0):
                if not self.started:  # no request to finish yet: a load need not end first
                    log.info("parent process %s is gone while starting: exiting",
                             self.parent_pid)
                    os._exit(0)
                log.info("parent process %s is gone: shutting down", self.parent_pid)
                self.handle_exit(15, None)
                return
            threading.Event().wait(0.5)

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self._signalled:
            log.warning("second signal: exiting now")
            # the tasks uvicorn cancels now are expected, not "Exception in ASGI application"
            logging.getLogger("uvicorn.error").addFilter(_not_cancelled)
            self._end_requests()
            self.should_exit = self.force_exit = True
            # a worker thread stuck in a long call would hold the interpreter's exit
            hard = threading.Timer(FORCED_EXIT_SECONDS, os._exit, (1,))
            hard.daemon = True
            hard.start()
            return
        self._signalled = True
        lifecycle = getattr(self.app.state, "lifecycle", None)
        if lifecycle is not None:
            lifecycle.drain()  # /ready: 503 from now on
        if self.drain_delay <= 0:
            self._stop_accepting()
            return
        log.info("draining: /ready answers 503; serving on for %gs before shutting down",
                 self.drain_delay)
        timer = threading.Timer(self.drain_delay, self._stop_accepting)
        timer.daemon = True
        timer.start()

    def _stop_accepting(self) -> None:
        if self.should_exit:  # a second signal came first
            return
        self.should_exit = True
        log.info("shutting down: running requests have %gs to finish", self.grace)
        timer = threading.Timer(self.grace, self._deadline)
        timer.daemon = True
        timer.start()

    def _end_requests(self) -> None:
        """End every running request with a "shutting down" error."""
        pool = getattr(self.app.state, "pool", None)
        for served in list(pool.models.values()) if pool else []:
            served.engine.fail_all("the server is shutting down")
            served.embedder.cancel_all()

    def _deadline(self) -> None:
        self._end_requests()
        backstop = threading.Timer(3.0, setattr, (AppStatus, "should_exit", True))
        backstop.daemon = True  # streams still open after their error event: close them
        backstop.start()
