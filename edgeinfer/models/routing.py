"""``model: "auto"``: which configured model answers a request. Pure rules, no I/O.

The rules, from models.toml's ``[routing]`` table (each names a model id)::

    tools   = "..."   # the request offers tools
    code    = "..."   # the messages look like programming
    long    = "..."   # the prompt does not fit the chosen model's context
    default = "..."   # everything else (if absent: the first chat-tagged model)

When the prompt (estimated at 3 characters a token, plus max_tokens) does not
fit the chosen model's context, the ``long`` model is taken if it fits, else
the chat model with the smallest context that fits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from edgeinfer.config import ModelConfig

_CODE = re.compile(r"```|\b(def|class|function|import|return|const|var|#include|SELECT|"
                   r"python|javascript|typescript|rust|golang|java|sql|regex|compile|bug|"
                   r"stack trace|code)\b", re.IGNORECASE)
CHARS_PER_TOKEN = 3


@dataclass(frozen=True, slots=True)
class Features:
    has_tools: bool
    text: str  # all message text
    max_tokens: int

    @property
    def looks_like_code(self) -> bool:
        return bool(_CODE.search(self.text))

    @property
    def tokens_needed(self) -> int:
        return len(self.text) // CHARS_PER_TOKEN + self.max_tokens


def route(rules: tuple[tuple[str, str], ...], models: list[ModelConfig], f: Features) -> str:
    """The id of the model that should answer."""
    by_id = {m.id: m for m in models}
    rule = {when: mid for when, mid in rules if mid in by_id}  # (of the models served)
    chat = [m for m in models if "chat" in m.tags] or models
    choice = rule.get("default", chat[0].id)
    if f.has_tools and "tools" in rule:
        choice = rule["tools"]
    elif f.looks_like_code and "code" in rule:
        choice = rule["code"]
    need = f.tokens_needed
    if need > by_id[choice].context:
        long_id = rule.get("long")
        if long_id is not None and need <= by_id[long_id].context:
            return long_id
        fitting = sorted((m for m in chat if need <= m.context), key=lambda m: m.context)
        if fitting:
            return fitting[0].id
    return choice
