"""``edgeinfer serve --ray [ADDRESS]``: deploy the application and wait, like ``serve run``.

Without ADDRESS, ``ray.init()`` joins the local cluster ``ray start`` started (or
``$RAY_ADDRESS``), else starts a private one for this command. Ray Serve's HTTP proxy
listens on the config's host and port (if Serve is not running yet). Once the
application runs, one line goes to stdout::

    EDGEINFER_READY {"url": "http://127.0.0.1:8080", "pid": 4242, "replicas": 2}

SIGINT / SIGTERM delete the application (its replicas drain first) and leave the
cluster; a cluster this command started stops with it; a second signal exits at once.
One edgeinfer application runs on a cluster: a second ``serve --ray`` is refused (it
would have replaced the first), and so is a ``--host`` / ``--port`` that Serve, already
running there, does not listen on (its HTTP options are set once per cluster).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from edgeinfer import __version__
from edgeinfer.api.guard import WILDCARD_HOSTS
from edgeinfer.cli.server import announce_ready
from edgeinfer.cluster.app import ClusterOptions, build
from edgeinfer.config import ServerConfig
from edgeinfer.errors import ConfigError

log = logging.getLogger("edgeinfer")

APP_NAME = "edgeinfer"


def _connect(address: str | None) -> None:
    import ray

    runtime_env: dict[str, Any] = {"env_vars": {"EDGEINFER_CACHE": os.environ["EDGEINFER_CACHE"]}
                                   } if "EDGEINFER_CACHE" in os.environ else {}
    ray.init(address=address, namespace="edgeinfer", runtime_env=runtime_env or None,
             include_dashboard=False, log_to_driver=True)


def _wait_for_signal() -> None:
    """Until SIGINT / SIGTERM; then a second one ends the process as it would by default."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _check_free(serve: Any) -> None:
    """ConfigError when an edgeinfer application already runs on the cluster."""
    if APP_NAME in serve.status().applications:
        raise ConfigError("an edgeinfer application already runs on this Ray cluster (another "
                          "`edgeinfer serve --ray`): stop it first (or `serve delete edgeinfer`)")


_SERVE_HEALTH = (b"success", b"Route table is not populated yet.",
                 b"No replicas are available yet.", b"This node is being drained.")


def _listening(url: str, tries: int = 15) -> bool:
    """Whether Ray Serve's proxy answers at ``url`` (its health path says one of its
    messages: 200 or, with nothing deployed yet, 503) within about ``tries`` seconds;
    another program on that port does not count."""
    for _ in range(tries):
        try:
            with urllib.request.urlopen(f"{url}/-/healthz", timeout=5) as r:
                return bool(r.read(128).strip() in _SERVE_HEALTH)
        except urllib.error.HTTPError as exc:
            return bool(exc.read(128).strip() in _SERVE_HEALTH)
        except OSError:
            time.sleep(1.0)
    return False


def serve_on_ray(config: ServerConfig, address: str | None, opts: ClusterOptions,
                 route_prefix: str = "/", ready_file: Path | None = None) -> int:
    """Deploy ``config`` on the Ray cluster at ``address`` and serve until a signal."""
    import ray
    from ray import serve

    app = build(config, opts)  # options are checked before anything starts
    written: Path | None = None
    _connect(address)
    try:
        serve.start(http_options={"host": config.host, "port": config.port})
        _check_free(serve)
        base = f"http://{config.host}:{config.port}"
        near = "127.0.0.1" if config.host in WILDCARD_HOSTS else config.host
        if not _listening(f"http://{f'[{near}]' if ':' in near else near}:{config.port}"):
            raise ConfigError(f"Ray Serve's proxy does not answer at {base}: Serve runs on this "
                              "cluster with another --host / --port (set once; `serve "
                              "shutdown` resets them), or another program holds the port")
        log.info("edgeinfer %s: deploying %s on Ray (%d replicas, %s routing)", __version__,
                 ", ".join(m.id for m in config.models), opts.replicas, opts.router)
        serve.run(app, name=APP_NAME, route_prefix=route_prefix)
        url = f"{base}{route_prefix.rstrip('/')}"
        log.info("edgeinfer ready on Ray at %s/v1", url)
        if announce_ready({"url": url, "pid": os.getpid(), "replicas": opts.replicas},
                          ready_file):
            written = ready_file
        _wait_for_signal()
        log.info("stopping: deleting the application (replicas drain up to %gs)",
                 opts.drain_s)
        serve.delete(APP_NAME)
        return 0
    finally:
        if written is not None:  # (never another instance's)
            written.unlink(missing_ok=True)
        ray.shutdown()
