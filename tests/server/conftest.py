"""Fixtures for tests against a real server process: one shared server with the default
model (8 slots), and the official OpenAI clients pointed at it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from serverproc import ServerProcess, start_server, stop_server


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = start_server(tmp_path_factory.mktemp("server"), "--slots", "8", "--threads", "2")
    yield srv
    stop_server(srv)


@pytest.fixture()
def client(server: ServerProcess):  # type: ignore[no-untyped-def]
    from openai import OpenAI

    return OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture()
def aclient(server: ServerProcess):  # type: ignore[no-untyped-def]
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0,
                       timeout=120)
