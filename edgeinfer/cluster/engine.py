"""The engine deployment: one replica = one in-process pool serving the whole HTTP API.

The replica starts the pool in its constructor (models with ``preload`` load before the
replica counts as running), answers ``Envelope``s through the app in memory, reports
itself unhealthy to Ray when an engine thread has stopped, and closes the pool when
Ray stops it (after ``graceful_shutdown_timeout_s`` of draining).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from ray import serve

from edgeinfer.cluster.exchange import Envelope, Head, call_app
from edgeinfer.config import ServerConfig
from edgeinfer.inprocess import EdgeInfer

log = logging.getLogger("edgeinfer.cluster")


class EngineReplica:
    """A Ray Serve replica running edgeinfer's pool; see the module docstring."""

    async def __init__(self, config: ServerConfig) -> None:  # type: ignore[misc]
        try:
            self.replica = serve.get_replica_context().replica_id.unique_id
        except Exception:  # outside a Serve replica (tests)
            self.replica = "local"
        self.edge = EdgeInfer(config)
        await self.edge.start()
        self.app = self.edge.asgi_app()
        log.info("replica %s serving %s", self.replica,
                 ", ".join(self.edge.pool.models) or "(models load on demand)")

    async def handle(self, env: Envelope) -> AsyncIterator[Head | bytes]:
        """Answer one HTTP request: a ``Head``, then the rest of the body."""
        async for part in call_app(self.app, env, self.replica):
            yield part

    async def check_health(self) -> None:
        """Ray's health check: raising marks the replica unhealthy and replaces it."""
        stopped = [mid for mid, m in self.edge.pool.models.items() if not m.engine.is_running]
        if stopped:
            raise RuntimeError(f"engine stopped for {', '.join(stopped)}")

    async def __del__(self) -> None:
        log.info("replica %s stopping: closing the pool", self.replica)
        await self.edge.close()
