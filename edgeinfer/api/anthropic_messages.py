"""(being written)"""

from __future__ import annotations

from typing import Any

from starlette.routing import Route

ROUTES: list[Route] = []
OPENAPI_PATHS: dict[str, Any] = {}
