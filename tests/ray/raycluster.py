"""A local Ray cluster for the tests: ``ray.init`` in this process (few CPUs, no
dashboard), Ray Serve's proxy on a free port, and edgeinfer deployed on it by its own
command (``edgeinfer serve --ray ADDRESS``) in a child process.

Everything started here is stopped by ``stop``: the command gets SIGINT (it deletes its
application, whose replicas drain), then Serve and the cluster shut down, and any
process of the cluster still alive is killed by its id.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

log = logging.getLogger("tests.ray")
VENV_BIN = Path(sys.executable).parent
READY = "EDGEINFER_READY "
SLOTS = 4
# two SmolLM2 replicas with one thread each
CLI_ARGS = ["--replicas", "2", "--model", "default", "--threads", "1", "--slots", str(SLOTS),
            "--context", "8192"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RayCluster:
    port: int
    address: str
    cli: subprocess.Popen[str]
    output: list[str] = field(default_factory=list)
    before: set[int] = field(default_factory=set)  # children that were not ours

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _pump(proc: subprocess.Popen[str], lines: list[str], ready: threading.Event) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if line.startswith(READY):
            ready.set()
    ready.set()


def start(tmp: Path, cli_args: list[str], num_cpus: int = 4,
          timeout: float = 240.0) -> RayCluster:
    """A cluster with Serve on a free port and ``edgeinfer serve --ray`` deployed on it."""
    import ray
    from ray import serve

    env_vars = {"EDGEINFER_CACHE": str(tmp / "cache")}
    before = {p.pid for p in _children()}
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
             namespace="edgeinfer-tests", runtime_env={"env_vars": env_vars})
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    address = ray.get_runtime_context().gcs_address
    cli = subprocess.Popen(
        [str(VENV_BIN / "edgeinfer"), "serve", "--ray", address, "--port", str(port),
         "--log-level", "warning", *cli_args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, **env_vars})
    cluster = RayCluster(port, address, cli, before=before)
    ready = threading.Event()
    threading.Thread(target=_pump, args=(cli, cluster.output, ready), daemon=True).start()
    if not ready.wait(timeout) or cli.poll() is not None:
        stop(cluster)
        raise RuntimeError("edgeinfer serve --ray did not become ready:\n"
                           + "\n".join(cluster.output[-40:]))
    return cluster


def _children() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


def _ours(cluster: RayCluster) -> list[psutil.Process]:
    """The processes ``start`` made: children that did not exist before ``ray.init``."""
    return [p for p in _children() if p.pid not in cluster.before]


def stop(cluster: RayCluster) -> None:
    import ray
    from ray import serve

    started = _ours(cluster)
    if cluster.cli.poll() is None:
        cluster.cli.send_signal(signal.SIGINT)
        try:
            cluster.cli.wait(90)
        except subprocess.TimeoutExpired:
            cluster.cli.kill()
            cluster.cli.wait(10)
    try:
        serve.shutdown()
    finally:
        ray.shutdown()
    deadline = time.monotonic() + 20
    for proc in started:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except psutil.TimeoutExpired:
            log.warning("killing leftover process %s %s", proc.pid, proc.name())
            proc.kill()
        except psutil.NoSuchProcess:
            pass
