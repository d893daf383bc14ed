"""How deep a client's JSON may nest.

Python's ``json`` parses about 1,000 levels, but what is done with a value afterwards
(``json.dumps``, a chat template's ``tojson``, the schema converter) recurses too and
would fail on far fewer: a request body, and a JSON text inside one (a past tool call's
``arguments``), nests at most ``MAX_DEPTH`` arrays and objects deep.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 128


def shallow(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests at most ``limit`` arrays and objects deep."""
    level: list[Any] = [value] if isinstance(value, (dict, list)) else []
    for _ in range(limit):
        level = [c for node in level
                 for c in (node.values() if isinstance(node, dict) else node)
                 if isinstance(c, (dict, list))]
        if not level:
            return True
    return not level


def loads(text: str) -> Any:
    """``json.loads`` that raises ValueError for a value nesting past MAX_DEPTH."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError("the JSON text nests too deeply") from None
    if not shallow(value):
        raise ValueError(f"the JSON text nests more than {MAX_DEPTH} levels deep")
    return value
