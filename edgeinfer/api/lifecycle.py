"""Where the server stands, for the probes: liveness (``GET /health``) and readiness
(``GET /ready``).

- Liveness: the process answers HTTP and nothing in it is wedged: no loaded model's
  engine thread has died, and start-up did not fail for every model. A load balancer
  or Kubernetes restarts a server that fails it. Loading and draining are alive.
- Readiness: the server should be sent requests now: start-up loading is over (the
  first model and those with ``preload``), none of those failed to load, every loaded
  engine runs, and the server is not draining. Models that load on demand later (or
  unload when idle) do not make it unready: a request loads them.

The phase moves LOADING -> SERVING (or FAILED) once, when start-up loading ends, and to
DRAINING from any phase when shutdown begins. The app's lifespan moves it at start-up,
the server (``edgeinfer.cli.server``) at the first SIGTERM / SIGINT. Each move is one
attribute assignment, so a signal handler or a timer thread may make it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from edgeinfer.models.pool import ModelPool, ModelState


class Phase(StrEnum):
    LOADING = "loading"  # start-up models are loading (the server already answers)
    SERVING = "serving"
    FAILED = "failed"  # start-up loading failed for every model
    DRAINING = "draining"  # shutting down: running requests finish, no new traffic wanted


@dataclass(slots=True)
class Lifecycle:
    """The server's phase; see the module docstring for the transitions."""

    phase: Phase = Phase.LOADING
    error: str | None = field(default=None)

    def serving(self) -> None:
        if self.phase is Phase.LOADING:
            self.phase = Phase.SERVING

    def failed(self, error: str) -> None:
        if self.phase is Phase.LOADING:
            self.phase, self.error = Phase.FAILED, error

    def drain(self) -> None:
        self.phase = Phase.DRAINING


def _stopped_engines(pool: ModelPool) -> list[str]:
    return [mid for mid, m in pool.models.items() if not m.engine.is_running]


def liveness(lifecycle: Lifecycle, pool: ModelPool) -> list[str]:
    """Why the server is not alive (empty: alive)."""
    reasons = [f"the engine of model {mid!r} has stopped" for mid in _stopped_engines(pool)]
    if lifecycle.phase is Phase.FAILED:
        reasons.append(f"start-up failed: {lifecycle.error}")
    return reasons


def startup_models(pool: ModelPool) -> list[str]:
    """The models loaded at start-up: the first one and those with ``preload``."""
    return [cfg.id for i, cfg in enumerate(pool.config.models) if cfg.preload or i == 0]


def readiness(lifecycle: Lifecycle, pool: ModelPool) -> list[str]:
    """Why the server should not be sent requests now (empty: ready)."""
    if lifecycle.phase is Phase.DRAINING:
        return ["draining: the server is shutting down"]
    if lifecycle.phase is Phase.FAILED:
        return [f"start-up failed: {lifecycle.error}"]
    reasons = []
    for mid in startup_models(pool):
        entry = pool.entries[mid]
        if entry.state is ModelState.FAILED:
            reasons.append(f"model {mid!r} failed to load: {entry.error}")
        elif lifecycle.phase is Phase.LOADING and entry.state is not ModelState.LOADED:
            reasons.append(f"model {mid!r} is loading")
    if lifecycle.phase is Phase.LOADING and not reasons:
        reasons.append("start-up is not finished")
    reasons += [f"the engine of model {mid!r} has stopped" for mid in _stopped_engines(pool)]
    return reasons
