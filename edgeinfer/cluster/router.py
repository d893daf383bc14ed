"""Prefix-aware routing as a Ray Serve request router (``RequestRouterConfig``).

Configured on the engine deployment; it runs inside every process that holds a handle
to it (the ingress replicas). It reads the ``Envelope`` the ingress passes as the call's
first argument, ranks the replicas with ``affinity.rank`` on their queue lengths
(Ray's cached values, probed when missing or stale) and records each routed request's
blocks against its replica. Requests without a prefix key (model lists, health, short
prompts) and calls with one replica get Ray's power-of-two choices.

Compared with ``ray.serve.llm.request_router.PrefixCacheAffinityRouter``: that router
keeps a character prefix tree in a detached actor shared by all handles and calls it
with blocking ``ray.get`` on every request; this one keeps a block-hash table in the
handle's process (no remote call on the routing path) and breaks ties with a
rendezvous hash, so several ingress replicas agree on new prefixes without sharing
state. With one ingress replica (the default) the table sees every request.
"""

from __future__ import annotations

import logging
import math
import random
from typing import Any

from ray.serve._private.common import ReplicaID
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from edgeinfer.cluster.affinity import PrefixTable, rank
from edgeinfer.cluster.exchange import Envelope

log = logging.getLogger("edgeinfer.cluster.router")


def _prefix_of(request: PendingRequest | None) -> tuple[int, ...]:
    if request is None or not request.args:
        return ()
    env = request.args[0]
    return env.prefix if isinstance(env, Envelope) else ()


class PrefixAffinityRouter(RequestRouter):
    """Send a request where its prompt's prefix went before, within a load bound."""

    def initialize_state(self, imbalance: float = 4, max_blocks_per_replica: int = 4096,
                         **_: Any) -> None:
        """``imbalance``: how many more ongoing requests than the least loaded replica a
        replica holding the prefix may have and still get it. ``max_blocks_per_replica``:
        block hashes remembered per replica (256 characters each)."""
        self.imbalance = float(imbalance)
        self.table = PrefixTable(int(max_blocks_per_replica))

    async def _loads(self, replicas: list[RunningReplica]) -> dict[str, float]:
        loads: dict[str, float] = {}
        unknown = []
        cache = self.replica_queue_len_cache
        for r in replicas:
            q = cache.get(r.replica_id)
            if q is None or q >= r.max_ongoing_requests:
                unknown.append(r)
            else:
                loads[r.replica_id.to_full_id_str()] = float(q)
        if unknown:
            for r, q in await self._probe_queue_lens(unknown, 0):
                ok = q is not None and q < r.max_ongoing_requests
                loads[r.replica_id.to_full_id_str()] = float(q) if ok and q is not None \
                    else math.inf
        return loads

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None,
                              ) -> list[list[RunningReplica]]:
        blocks = _prefix_of(pending_request)
        if not candidate_replicas:
            return []
        if not blocks or len(candidate_replicas) == 1:
            return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]
        by_id = {r.replica_id.to_full_id_str(): r for r in candidate_replicas}
        loads = await self._loads(candidate_replicas)
        if all(v == math.inf for v in loads.values()):
            return [random.sample(candidate_replicas, 2)]
        groups = rank(blocks, loads, self.table, self.imbalance)
        log.debug("prefix %x: %s (loads %s)", blocks[0], groups, loads)
        return [[by_id[i] for i in g] for g in groups]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: Any) -> None:
        blocks = _prefix_of(pending_request)
        if blocks:
            self.table.record(replica_id.to_full_id_str(), blocks)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        live = {r.replica_id.to_full_id_str() for r in replicas}
        for gone in set(self.table.replicas()) - live:
            self.table.forget(gone)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.table.forget(replica_id.to_full_id_str())
