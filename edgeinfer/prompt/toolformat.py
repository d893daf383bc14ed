"""The tool-call formats models are trained on, and which one a chat template speaks.

Every format here writes calls as JSON objects ``{"name": ..., "arguments": {...}}``
(the arguments key differs) around its own markers:

- ``hermes``: Hermes 2 Pro / 3, Qwen 2.5, Qwen3, Granite 4: each call in
  ``<tool_call> ... </tool_call>``.
- ``llama3``: Llama 3.1 / 3.2 / 3.3: one bare ``{"name": ..., "parameters": ...}`` object,
  or the ``<|python_tag|>`` form.
- ``mistral``: Mistral Nemo and the v3 tokenizer models: ``[TOOL_CALLS][{...}, ...]``
  with a 9-character ``id`` in each call.
- ``granite``: Granite 3.x: ``<|tool_call|>[{...}, ...]``.
- ``generic``: any other template: the tools go in a system message and the calls in
  the Hermes syntax (the model was not trained on it; a grammar keeps calls valid).

Not covered (these fall back to ``generic``): Qwen3-Coder's XML calls, gpt-oss Harmony,
DeepSeek's tool-call tokens, Mistral's v11 ``[TOOL_CALLS]name[ARGS]{...}``, Gemma 4.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ToolFormat:
    name: str
    open: str  # the marker before the call(s) ("" for none)
    close: str = ""  # the marker after each call ("": none)
    args_key: str = "arguments"
    listed: bool = False  # the calls are one JSON list after ``open``
    bare: bool = False  # an output that starts with ``{`` is a call, without a marker
    native: bool = True  # the template renders tools, calls and results itself
    id_length: int = 0  # calls carry an "id" of this many letters and digits (0: none)
    max_calls: int = 4  # calls one answer may hold

    @property
    def trigger(self) -> str:
        """The word that starts a call in free text (a lazy grammar's trigger)."""
        return self.open or '{"name"'


HERMES = ToolFormat("hermes", "<tool_call>", "</tool_call>")
GENERIC = ToolFormat("generic", "<tool_call>", "</tool_call>", native=False)
LLAMA3 = ToolFormat("llama3", "<|python_tag|>", args_key="parameters", bare=True, max_calls=1)
MISTRAL = ToolFormat("mistral", "[TOOL_CALLS]", listed=True, id_length=9)
GRANITE = ToolFormat("granite", "<|tool_call|>", listed=True)
FORMATS = {f.name: f for f in (HERMES, GENERIC, LLAMA3, MISTRAL, GRANITE)}


def detect(template_source: str) -> ToolFormat:
    """The format a chat template speaks, from the markers it writes; ``GENERIC`` for a
    template without tool support or with a format not covered here."""
    src = template_source
    if "tools" not in src:
        return GENERIC
    if "[TOOL_CALLS]" in src:
        return GENERIC if "[ARGS]" in src else MISTRAL
    if "<|tool_call|>" in src:
        return GRANITE
    if "<tool_call>" in src:
        return GENERIC if "<function=" in src else HERMES
    if "<|python_tag|>" in src or '"parameters": ' in src and "ipython" in src:
        return LLAMA3
    return GENERIC


def choose(setting: str, template_source: str) -> ToolFormat:
    """The format for a model: ``setting`` from models.toml ("auto": detect it)."""
    if setting == "auto":
        return detect(template_source)
    return FORMATS[setting]
