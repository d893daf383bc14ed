"""Reasoning kept apart from the answer: ``<think> ... </think>`` blocks and their kin.

Models of the Qwen3, QwQ, DeepSeek R1, SmolLM3 and GLM families write their
reasoning inside ``<think>`` tags (llama-server's "deepseek" reasoning format);
Magistral / Ministral 3 use ``[THINK] ... [/THINK]``, Gemma 4 ``<|channel>thought
... <channel|>``, Command R7B / A ``<|START_THINKING|> ... <|END_THINKING|>``, Hunyuan 3
``<think:opensource> ... </think:opensource>``, MiniMax M3 ``<mm:think> ... </mm:think>``,
Solar Open ``<|think|> ... <|end|><|begin|>assistant``, Apertus ``<|inner_prefix|> ...
<|inner_suffix|>``, Apriel 1.6 ``Here are my reasoning steps:`` (in the prompt) ...
``[BEGIN FINAL RESPONSE]``, Kimi K3 ``<|open|>think<|sep|> ... <|close|>think<|sep|>``
(gpt-oss's
Harmony channels are read by ``edgeinfer.prompt.harmony``).
Templates often open the block in the generation prompt itself, so the output starts
inside it; ``ReasoningSplit(in_thought=True)`` covers that.

Formats, per model (models.toml ``reasoning_format``) or per request
(``reasoning_format``): ``"auto"`` (split when the chat template uses one of the
markers), ``"deepseek"`` (always split, ``<think>`` unless the template uses other
markers), ``"none"`` (leave everything in the content).
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeinfer.prompt.callparser import partial_suffix

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
FORMATS = ("auto", "deepseek", "none")


@dataclass(frozen=True, slots=True)
class Markers:
    """The markers around a reasoning block."""

    open: str
    close: str
    sign: str = ""  # what shows them in a template's source ("": the opening marker)

    @property
    def used_by(self) -> str:
        return self.sign or self.open.rstrip()


THINK = Markers(THINK_OPEN, THINK_CLOSE)
MISTRAL_THINK = Markers("[THINK]", "[/THINK]")
GEMMA_THOUGHT = Markers("<|channel>thought\n", "<channel|>")
COHERE_THINK = Markers("<|START_THINKING|>", "<|END_THINKING|>")
# Hunyuan 3's template builds its markers with format(): '<think{}>'.format(':opensource')
HY3_THINK = Markers("<think:opensource>", "</think:opensource>", "'<think{}>'.format(HYTK)")
MM_THINK = Markers("<mm:think>", "</mm:think>")  # MiniMax M3
# Solar Open: its reasoning is a message of its own, the answer's message follows
SOLAR_THINK = Markers("<|think|>", "<|end|><|begin|>assistant", "<|begin|>assistant<|think|>")
# Kimi K3: its tags, built by a macro (the prompt opens the block when thinking)
K3_THINK = Markers("<|open|>think<|sep|>", "<|close|>think<|sep|>", "open_tag('think')")
APERTUS_INNER = Markers("<|inner_prefix|>", "<|inner_suffix|>")
# Muse Glimmer: reasoning is a message to "self" (the prompt wrote "<|start|>assistant")
MUSE_SELF = Markers("to=self<|message|>", "<|eom|>")
# Apriel 1.6: the prompt opens the reasoning with these words, a marker ends it
APRIEL_STEPS = Markers("Here are my reasoning steps:\n", "[BEGIN FINAL RESPONSE]")
KINDS = (MISTRAL_THINK, GEMMA_THOUGHT, COHERE_THINK, HY3_THINK, MM_THINK, SOLAR_THINK,
         APERTUS_INNER, APRIEL_STEPS, K3_THINK, MUSE_SELF, THINK)
HARMONY_ANALYSIS = "<|channel|>analysis"


def markers_for(reasoning_format: str, template_source: str) -> Markers | None:
    """The reasoning markers to split on for this format and template (None: no split;
    Harmony templates are read by their own parser, see ``harmony_reasoning``)."""
    if reasoning_format == "none" or HARMONY_ANALYSIS in template_source:
        return None
    for m in KINDS:
        if m.used_by in template_source:
            return m
    return THINK if reasoning_format == "deepseek" else None


def reasoning_markers(template_source: str) -> tuple[str, ...]:
    """Every reasoning marker a template uses (to be shown in the output)."""
    found = [m for m in KINDS if m.used_by in template_source]
    return tuple(t.rstrip() for m in found for t in (m.open, m.close))


def harmony_reasoning(reasoning_format: str, template_source: str) -> bool:
    """Whether a Harmony template's analysis channel is split off as reasoning."""
    return reasoning_format != "none" and HARMONY_ANALYSIS in template_source


def splits(reasoning_format: str, template_source: str) -> bool:
    """Whether output is split into reasoning and content for this format and template."""
    return (markers_for(reasoning_format, template_source) is not None
            or harmony_reasoning(reasoning_format, template_source))


def starts_in_thought(rendered_prompt: str, markers: Markers = THINK) -> bool:
    """Whether the prompt leaves a reasoning block open (the output starts inside it)."""
    tail = rendered_prompt.rstrip()
    return tail.endswith(markers.open.rstrip())


@dataclass(frozen=True, slots=True)
class Thought:
    """Reasoning text."""

    text: str


@dataclass(frozen=True, slots=True)
class Said:
    """Answer text (outside any reasoning block)."""

    text: str


class ReasoningSplit:
    """Incremental splitter of generated text into ``Thought`` and ``Said`` pieces.

    A reasoning block opens with ``<think>`` at the start of the output (leading
    whitespace allowed) or is already open (``in_thought``); it closes at
    ``</think>``, after which everything is answer (a later ``<think>`` is answer
    text). Text that could be the start of a marker is held back until it is
    known; ``finish`` releases it. Whitespace right after the block is dropped.
    ``exits``: words that end an open block and are answer text themselves (a tool-call
    marker: Kimi K2 Thinking may call a tool without closing its reasoning, and a lazy
    call grammar has already started there).
    """

    def __init__(self, in_thought: bool = False, markers: Markers = THINK,
                 exits: tuple[str, ...] = ()) -> None:
        self.markers = markers
        self.exits = tuple(e for e in exits if e)
        self._buf = ""
        self._state = "thinking" if in_thought else "start"
        self._trim = False  # drop whitespace that follows the closing marker

    @property
    def in_answer(self) -> bool:
        """Past the reasoning block (or there was none): what comes is answer text."""
        return self._state == "answer"

    def feed(self, text: str) -> list[Thought | Said]:
        self._buf += text
        out: list[Thought | Said] = []
        if self._state == "start":
            head, opener = self._buf.lstrip(), self.markers.open.rstrip()
            if head.startswith(opener) and (len(head) > len(opener) or opener == self.markers.open):
                # the marker's own line break may be missing (Gemma 4's empty thought:
                # "<|channel>thought<channel|>")
                self._buf = head[len(opener):].removeprefix(self.markers.open[len(opener):])
                self._state = "thinking"
            elif head.startswith(self.markers.close):  # a bare end of no block (MiniMax
                # M3's answers without reasoning, as its template writes past ones)
                self._buf, self._state, self._trim = head[len(self.markers.close):], "answer", True
            elif self.markers.open.startswith(head) or self.markers.close.startswith(head):
                return out  # undecided: could still become <think>
            else:
                self._state = "answer"
        if self._state == "thinking":
            close = self.markers.close
            at, used = self._buf.find(close), len(close)
            for word in self.exits:  # kept: the answer starts with it
                j = self._buf.find(word)
                if j != -1 and (at == -1 or j < at):
                    at, used = j, 0
            if at == -1:
                keep = max(partial_suffix(self._buf, m) for m in (close, *self.exits))
                cut = len(self._buf) - keep
                if cut:
                    out.append(Thought(self._buf[:cut]))
                self._buf = self._buf[cut:]
                return out
            if at:
                out.append(Thought(self._buf[:at]))
            self._buf = self._buf[at + used:]
            self._state, self._trim = "answer", used > 0
        if self._trim:
            self._buf = self._buf.lstrip()
            if not self._buf:
                return out
            self._trim = False
        if self._buf:
            out.append(Said(self._buf))
            self._buf = ""
        return out

    def finish(self) -> list[Thought | Said]:
        """End of output: what was held back (an unclosed block stays reasoning)."""
        rest, self._buf = self._buf, ""
        if not rest:
            return []
        if self._state == "thinking":
            return [Thought(rest)]
        if self._trim:
            rest = rest.lstrip()
        return [Said(rest)] if rest else []
