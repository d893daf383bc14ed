"""The ``edgeinfer`` command."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgeinfer import __version__
from edgeinfer.config import (
    ModelConfig,
    ServerConfig,
    load_config,
    override_model,
    read_api_key_file,
)
from edgeinfer.errors import ConfigError, ModelLoadError

log = logging.getLogger("edgeinfer")

LOOPBACK_BIND = frozenset({"127.0.0.1", "localhost", "::1"})


def _serve_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("serve", help="serve the configured models over HTTP",
                       description="Serve models from models.toml (or one GGUF file) with an "
                       "OpenAI-style API.")
    p.add_argument("--config", type=Path, default=None,
                   help="models.toml to read (default: the one beside the package)")
    p.add_argument("--model", "-m", default=None,
                   help="serve only this model: an id or alias from the config, or a .gguf path")
    p.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port to listen on (default 8080)")
    p.add_argument("--slots", type=int, default=None, help="requests decoded together per model")
    p.add_argument("--context", "-c", type=int, default=None,
                   help="KV cells per model context, shared by its slots")
    p.add_argument("--threads", "-t", type=int, default=None, help="CPU threads per model")
    p.add_argument("--batch", type=int, default=None,
                   help="token budget of one engine step (chunked prefill)")
    p.add_argument("--gpu-layers", type=int, default=None, help="layers to offload to the GPU")
    p.add_argument("--max-queue", type=int, default=None,
                   help="requests waiting for a slot per model before new ones get 429")
    p.add_argument("--request-timeout", type=float, default=None,
                   help="seconds a request may take, waiting included (default 600)")
    p.add_argument("--shutdown-grace", type=float, default=10.0,
                   help="on SIGTERM/SIGINT, seconds running requests get to finish before they "
                   "end with an error (a second signal exits at once)")
    p.add_argument("--api-key-file", type=Path, default=None,
                   help="file with API keys, one per line (also: EDGEINFER_API_KEYS=k1,k2)")
    p.add_argument("--allow-unauthenticated-network", action="store_true",
                   help="let --host bind a non-loopback address without API keys: anyone who "
                   "can reach the address can use the server")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"], help="logging verbosity")


def _select(config: ServerConfig, args: argparse.Namespace) -> ServerConfig:
    models = config.models
    if args.model:
        path = Path(args.model).expanduser()
        if args.model.endswith(".gguf") or path.is_file():
            models = (ModelConfig(id=path.stem, path=path.resolve(), aliases=("default",)),)
        else:
            chosen = [m for m in models if args.model in m.names]
            if not chosen:
                names = ", ".join(n for m in models for n in m.names)
                raise ConfigError(f"no model named {args.model!r} in the config ({names})")
            models = tuple(chosen)
    models = tuple(
        override_model(m, slots=args.slots, context=args.context, threads=args.threads,
                       batch=args.batch, gpu_layers=args.gpu_layers, max_queue=args.max_queue,
                       request_timeout=args.request_timeout)
        for m in models
    )
    keys = list(config.api_keys)
    keys += [k.strip() for k in os.environ.get("EDGEINFER_API_KEYS", "").split(",") if k.strip()]
    if args.api_key_file:
        keys += read_api_key_file(args.api_key_file)
    host = args.host or config.host
    if host not in LOOPBACK_BIND and not keys and not args.allow_unauthenticated_network:
        raise ConfigError(f"refusing to bind {host} without API keys: anyone on the network could "
                          "use this server. Set keys (--api-key-file, EDGEINFER_API_KEYS) or pass "
                          "--allow-unauthenticated-network")
    return replace(config, host=host, port=config.port if args.port is None else args.port,
                   models=models, api_keys=tuple(keys))


def _graceful_server(uv_config: Any, app: Any, grace: float) -> Any:
    """A uvicorn server whose first signal drains and whose second one exits at once.

    First SIGTERM/SIGINT: stop accepting, let running requests finish for ``grace``
    seconds, then end the rest with an error event; exit status 0. Second signal:
    exit now.
    """
    import uvicorn
    from sse_starlette.sse import AppStatus

    # sse-starlette would cut every stream at the first signal; we drain instead
    AppStatus.disable_automatic_graceful_drain()

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.should_exit:
                log.warning("second signal: exiting now")
                self.force_exit = True
                return
            self.should_exit = True
            log.info("shutting down: running requests have %gs to finish", grace)
            timer = threading.Timer(grace, self._deadline)
            timer.daemon = True
            timer.start()

        def _deadline(self) -> None:
            pool = getattr(app.state, "pool", None)
            for served in list(pool.models.values()) if pool else []:
                served.engine.fail_all("the server is shutting down")
            backstop = threading.Timer(3.0, setattr, (AppStatus, "should_exit", True))
            backstop.daemon = True  # streams still open after their error event: close them
            backstop.start()

    return Server(uv_config)


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from edgeinfer.app import create_app

    config = _select(load_config(args.config), args)
    if config.models and any(m.batch < m.slots for m in config.models):
        raise ConfigError("--batch must be at least --slots")
    app = create_app(config)
    log.info("edgeinfer %s: serving %s on http://%s:%d/v1%s", __version__,
             ", ".join(m.id for m in config.models), config.host, config.port,
             f" ({len(config.api_keys)} API keys)" if config.api_keys else "")
    uv = uvicorn.Config(app, host=config.host, port=config.port, log_level=args.log_level,
                        access_log=args.log_level == "debug", lifespan="on",
                        timeout_graceful_shutdown=int(args.shutdown_grace) + 5)
    server = _graceful_server(uv, app, args.shutdown_grace)
    server.run()
    return 0 if getattr(server, "started", False) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edgeinfer", description="A local LLM server on "
                                     "llama.cpp with continuous batching.")
    parser.add_argument("--version", action="version", version=f"edgeinfer {__version__}")
    sub = parser.add_subparsers(dest="command")
    _serve_parser(sub)
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["serve", *(argv or [])])
    logging.basicConfig(level=getattr(logging, args.log_level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return serve(args)
    except (ConfigError, ModelLoadError) as exc:
        log.error("%s", exc)
        return 2


if __name__ == "__main__":
    sys.exit(main())
