"""The Serve application: the ingress in front of N engine replicas.

``build(config, options)`` is what ``edgeinfer serve --ray`` deploys; ``app_builder``
is the same for Ray's own tools (an application builder taking ``key=value`` args)::

    serve run edgeinfer.cluster.app:app_builder replicas=2 threads=1 model=default
    serve build edgeinfer.cluster.app:app_builder -o edgeinfer.yaml   # for `serve deploy`

The config (models.toml, parsed on the machine that deploys, with the command line's
overrides) travels to the replicas as a constructor argument; each node needs the same
Python environment (edgeinfer[ray] and the models it names, see docs/ray.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.deployment import Application

from edgeinfer.cluster.engine import EngineReplica
from edgeinfer.cluster.ingress import IngressForwarder
from edgeinfer.cluster.router import PrefixAffinityRouter
from edgeinfer.config import ServerConfig, load_config, override_model
from edgeinfer.errors import ConfigError

ROUTERS = ("prefix", "pow2")


@dataclass(frozen=True, slots=True)
class ClusterOptions:
    """How the application runs on Ray.

    ``replicas``: engine replicas, or with ``max_replicas`` the minimum of an autoscaled
    range (Ray adds replicas when the ongoing requests per replica pass
    ``target_ongoing``, default: the slots of the first model). ``router``: "prefix"
    (``PrefixAffinityRouter``) or "pow2" (Ray's default power of two choices).
    ``replica_cpus``: Ray CPUs reserved per replica (default: the model's threads).
    ``drain_s``: how long a stopping replica's running requests may take.
    """

    replicas: int = 2
    max_replicas: int | None = None
    target_ongoing: float | None = None
    max_ongoing: int | None = None
    router: str = "prefix"
    imbalance: float = 4
    replica_cpus: float | None = None
    drain_s: float = 30.0
    retries: int = 1

    def __post_init__(self) -> None:
        if self.router not in ROUTERS:
            raise ConfigError(f"router must be one of {', '.join(ROUTERS)}")
        if self.replicas < 1 or (self.max_replicas is not None
                                 and self.max_replicas < self.replicas):
            raise ConfigError("replicas must be >= 1 and max_replicas >= replicas")


def _engine_options(config: ServerConfig, opts: ClusterOptions) -> dict[str, Any]:
    first = config.models[0]
    slots = max(m.slots for m in config.models)
    scaling: dict[str, Any] = {"num_replicas": opts.replicas}
    if opts.max_replicas is not None:
        scaling = {"autoscaling_config": {
            "min_replicas": opts.replicas, "initial_replicas": opts.replicas,
            "max_replicas": opts.max_replicas,
            "target_ongoing_requests": opts.target_ongoing or slots,
            "upscale_delay_s": 10, "downscale_delay_s": 120}}
    router = None
    if opts.router == "prefix":
        router = RequestRouterConfig(request_router_class=PrefixAffinityRouter,  # type: ignore[arg-type]
                                     request_router_kwargs={"imbalance": opts.imbalance})
    return {
        **scaling,
        "name": "EdgeInferEngine",
        "max_ongoing_requests": opts.max_ongoing or 2 * slots,
        "graceful_shutdown_wait_loop_s": 1.0,
        "graceful_shutdown_timeout_s": opts.drain_s,
        "health_check_period_s": 5.0,
        "health_check_timeout_s": 30.0,
        "ray_actor_options": {"num_cpus": opts.replica_cpus if opts.replica_cpus is not None
                              else float(first.threads)},
        **({"request_router_config": router} if router is not None else {}),
    }


def build(config: ServerConfig, opts: ClusterOptions) -> Application:
    """The application serving ``config``'s models on ``opts.replicas`` engine replicas."""
    if not config.models:
        raise ConfigError("no models to serve")
    engine = serve.deployment(**_engine_options(config, opts))(EngineReplica)
    ingress = serve.deployment(
        name="EdgeInferIngress", num_replicas=1, max_ongoing_requests=1000,
        graceful_shutdown_timeout_s=opts.drain_s + 5,
        ray_actor_options={"num_cpus": 0})(IngressForwarder)
    return ingress.bind(engine.bind(config), retries=opts.retries)


_MODEL_KEYS = ("slots", "context", "threads", "batch", "max_queue")


def app_builder(args: dict[str, str]) -> Application:
    """``serve run edgeinfer.cluster.app:app_builder key=value ...``: config (a
    models.toml), model (serve only this one), slots, context, threads, batch,
    max_queue, and the ``ClusterOptions`` fields."""
    args = dict(args)
    config = load_config(Path(args.pop("config")) if "config" in args else None)
    wanted = args.pop("model", None)
    models = [m for m in config.models if wanted is None or wanted in m.names]
    if not models:
        raise ConfigError(f"no model named {wanted!r} in the config")
    changes = {k: int(args.pop(k)) for k in _MODEL_KEYS if k in args}
    config = replace(config, models=tuple(override_model(m, **changes) for m in models))
    kinds = {"router": str, "imbalance": float, "replica_cpus": float, "drain_s": float,
             "target_ongoing": float}
    opts = {k: kinds.get(k, int)(v) for k, v in args.items()}
    try:
        return build(config, ClusterOptions(**opts))
    except TypeError as exc:
        raise ConfigError(f"unknown option: {exc}") from None
