"""Checks of ``edgeinfer serve``'s flags: a bad value is a one-line error at start, not a
traceback later (or a server that cuts every stream); and its flags for a Ray cluster."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from edgeinfer.errors import ConfigError


def port(text: str) -> int:
    """A TCP port for argparse: 0 (a free one) to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535, not {port}")
    return port


def gpu_layers(text: str) -> int | str:
    """``--gpu-layers``: a count, or "auto" (what fits the GPU's free memory), as in
    models.toml."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of layers or \"auto\", not {text!r}") from None


def check_serve_flags(args: argparse.Namespace) -> None:
    """ConfigError for a flag out of its range (NaN included)."""
    positive = {"--header-timeout": args.header_timeout, "--body-timeout": args.body_timeout,
                "--max-connections": args.max_connections, "--send-timeout": args.send_timeout,
                "--request-timeout": args.request_timeout}
    for flag, value in positive.items():
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{flag} must be a number > 0, not {value}")
    for flag, value in {"--shutdown-grace": args.shutdown_grace,
                        "--drain-delay": args.drain_delay}.items():
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"{flag} must be a number >= 0, not {value}")
    if args.ready_file is None:
        return
    ready = args.ready_file = Path(os.path.abspath(args.ready_file.expanduser()))  # (once:
    if not ready.parent.is_dir():  # where it is tried is where it is written)
        raise ConfigError(f"--ready-file {ready}: its folder does not exist")
    probe = ready.with_name(f".{ready.name}.{os.getpid()}.tmp")  # (a trial write: permission
    try:  # bits do not say it for root)
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"--ready-file {ready}: its folder cannot be written "
                          f"({exc.strerror or exc})") from None


def ray_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("on a Ray cluster (pip install 'edgeinfer[ray]'; docs/ray.md)")
    g.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="serve on Ray Serve: join the cluster at ADDRESS (without it: the "
                   "local one `ray start` started, or a new one); --host/--port are its proxy's")
    g.add_argument("--replicas", type=int, default=2,
                   help="engine replicas (with --max-replicas: the fewest); default 2")
    g.add_argument("--max-replicas", type=int, default=None,
                   help="autoscale up to this many replicas on ongoing requests per replica")
    g.add_argument("--router", choices=["prefix", "pow2"], default="prefix",
                   help="prefix: send a prompt where its prefix is cached (default); "
                   "pow2: Ray Serve's default power of two choices")
