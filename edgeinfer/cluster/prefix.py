"""The prefix key of a request: chained hashes of the leading blocks of its prompt.

The ingress cannot render the chat template (it loads no model), so it hashes what the
template is rendered from, in prompt order: the model name, the system text or
instructions, the tools, then the messages / input / prompt, as canonical JSON.
Two requests whose prompts share a long beginning share their first blocks' hashes;
block ``i``'s hash covers blocks ``0..i``, so equal hashes mean equal prefixes.
Only whole blocks count: a prompt shorter than one block has no key (and is routed by
load alone: there is little to reuse).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

BLOCK_CHARS = 256  # ~64 tokens of English text
MAX_BLOCKS = 64  # the first 16 KiB of a prompt decide where it goes

# the fields of each dialect that become the prompt, in the order they appear in it
_PROMPT_FIELDS = ("model", "system", "instructions", "tools", "messages", "input", "prompt")
_GENERATION_PATHS = frozenset({
    "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
    "/api/chat", "/api/generate"})


def prompt_text(body: dict[str, Any]) -> str:
    """The canonical text of the parts of ``body`` that make its prompt, in order."""
    parts = []
    for name in _PROMPT_FIELDS:
        value = body.get(name)
        if value is not None:
            parts.append(f"{name}=" + json.dumps(value, sort_keys=True, ensure_ascii=False,
                                                 separators=(",", ":")))
    return "\n".join(parts)


def block_hashes(text: str, block: int = BLOCK_CHARS, limit: int = MAX_BLOCKS) -> tuple[int, ...]:
    """Chained 64-bit hashes of the whole ``block``-character blocks of ``text``."""
    out: list[int] = []
    prev = b""
    for i in range(min(len(text) // block, limit)):
        digest = hashlib.blake2b(prev + text[i * block:(i + 1) * block].encode(),
                                 digest_size=8).digest()
        out.append(int.from_bytes(digest, "big"))
        prev = digest
    return tuple(out)


def prefix_key(method: str, path: str, body: bytes) -> tuple[int, ...]:
    """The prefix key of an HTTP request: empty unless it is a generation with a JSON body."""
    if method != "POST" or path.rstrip("/") not in _GENERATION_PATHS or not body:
        return ()
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return ()  # the replica answers the 400
    if not isinstance(parsed, dict):
        return ()
    return block_hashes(prompt_text(parsed))
