"""The one reader of OpenAI-style server-sent events, for the CLI and the scripts."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx


def _chunk(line: str) -> dict[str, Any] | None:
    if not line.startswith("data: ") or line == "data: [DONE]":
        return None
    value = json.loads(line[6:])
    return value if isinstance(value, dict) else None


async def sse_json(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON chunks of a streamed response (an error event is a chunk too)."""
    async for line in response.aiter_lines():
        chunk = _chunk(line)
        if chunk is not None:
            yield chunk


def sse_json_sync(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """``sse_json`` for a synchronous client."""
    for line in response.iter_lines():
        chunk = _chunk(line)
        if chunk is not None:
            yield chunk


def delta_text(chunk: dict[str, Any]) -> str:
    """The content text a chat chunk adds, over its choices."""
    return "".join((c.get("delta") or {}).get("content") or ""
                   for c in chunk.get("choices", []))
