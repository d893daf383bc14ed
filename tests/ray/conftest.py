"""Fixtures for tests against a local Ray cluster: one cluster per test module, with
edgeinfer deployed by ``edgeinfer serve --ray`` (two SmolLM2 replicas, one thread each).

Ray is part of the test set-up (``scripts/test`` installs the ``ray`` extra); a missing
Ray fails these tests rather than skipping them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from raycluster import CLI_ARGS, RayCluster, start, stop


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    c = start(tmp_path_factory.mktemp("ray"), CLI_ARGS)
    yield c
    stop(c)


@pytest.fixture()
def client(cluster: RayCluster):  # type: ignore[no-untyped-def]
    from openai import OpenAI

    return OpenAI(base_url=f"{cluster.url}/v1", api_key="unused", max_retries=0, timeout=180)
