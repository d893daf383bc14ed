"""Markers by folder: tests/unit (no model, no server), tests/engine (a real model
in-process), tests/server (a real server process and the official SDK), tests/ray (a
local Ray cluster serving replicas, with the official SDK).

``pytest -m unit`` (or ``pytest tests/unit``) is the quick path. Imports nothing but
pytest, so the unit tests need none of the test tools' servers or clients.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
LAYERS = ("unit", "engine", "server", "ray")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(str(item.path)).resolve().relative_to(TESTS).parts[0]
        if folder in LAYERS:
            item.add_marker(getattr(pytest.mark, folder))
