"""``edgeinfer serve --ray [ADDRESS]``: deploy the application and wait, like ``serve run``.

Without ADDRESS, ``ray.init()`` joins the local cluster ``ray start`` started (or
``$RAY_ADDRESS``), else starts a private one for this command. Ray Serve's HTTP proxy
listens on the config's host and port (if Serve is not running yet). Once the
application runs, one line goes to stdout::

    EDGEINFER_READY {"url": "http://127.0.0.1:8080", "pid": 4242, "replicas": 2}

SIGINT / SIGTERM delete the application (its replicas drain first) and leave the
cluster; a cluster this command started stops with it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from typing import Any

from edgeinfer import __version__
from edgeinfer.cluster.app import ClusterOptions, build
from edgeinfer.config import ServerConfig

log = logging.getLogger("edgeinfer")

APP_NAME = "edgeinfer"
READY_PREFIX = "EDGEINFER_READY "


def _connect(address: str | None) -> None:
    import ray

    runtime_env: dict[str, Any] = {"env_vars": {"EDGEINFER_CACHE": os.environ["EDGEINFER_CACHE"]}
                                   } if "EDGEINFER_CACHE" in os.environ else {}
    ray.init(address=address, namespace="edgeinfer", runtime_env=runtime_env or None,
             include_dashboard=False, log_to_driver=True)


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass


def serve_on_ray(config: ServerConfig, address: str | None, opts: ClusterOptions,
                 route_prefix: str = "/") -> int:
    """Deploy ``config`` on the Ray cluster at ``address`` and serve until a signal."""
    import ray
    from ray import serve

    app = build(config, opts)  # options are checked before anything starts
    _connect(address)
    try:
        serve.start(http_options={"host": config.host, "port": config.port})
        log.info("edgeinfer %s: deploying %s on Ray (%d replicas, %s routing)", __version__,
                 ", ".join(m.id for m in config.models), opts.replicas, opts.router)
        serve.run(app, name=APP_NAME, route_prefix=route_prefix)
        url = f"http://{config.host}:{config.port}{route_prefix.rstrip('/')}"
        log.info("edgeinfer ready on Ray at %s/v1", url)
        sys.stdout.write(READY_PREFIX + json.dumps(
            {"url": url, "pid": os.getpid(), "replicas": opts.replicas}) + "\n")
        sys.stdout.flush()
        _wait_for_signal()
        log.info("stopping: deleting the application (replicas drain up to %gs)",
                 opts.drain_s)
        serve.delete(APP_NAME)
        return 0
    finally:
        ray.shutdown()
