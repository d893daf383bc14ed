"""edgeinfer on a Ray Serve cluster (the optional ``edgeinfer[ray]`` extra).

Two deployments make one Serve application:

- ``EdgeInferIngress`` (``ingress``): a thin HTTP forwarder behind Ray Serve's proxy. It
  reads the body, computes the request's prefix key (``prefix``) and calls the engine
  deployment through a DeploymentHandle, streaming the answer back.
- ``EdgeInferEngine`` (``engine``): each replica runs the in-process pool
  (``edgeinfer.inprocess.EdgeInfer``) and answers the whole HTTP API in memory.

The handle that calls the engines routes with ``router.PrefixAffinityRouter``, a Ray
Serve ``RequestRouter``: a request goes to the replica that was sent its prompt's
leading blocks before, unless that replica is busier than the least busy one by more
than ``imbalance`` requests. ``app`` builds the application (also for ``serve run``),
``launch`` is ``edgeinfer serve --ray``. See docs/ray.md.

Only ``prefix``, ``affinity`` and ``exchange`` import without Ray; the rest import it
at the top, and nothing outside this package imports them except lazily.
"""
