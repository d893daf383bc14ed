"""The sandbox a chat template renders in: jinja2's ImmutableSandboxedEnvironment with
budgets, because a template comes with a downloaded GGUF and is code.

Each rendering (``rendering``) has a time budget (``RENDER_SECONDS``, checked on every
call, item and attribute access), an output budget (``RENDER_BYTES``), a budget of the
text and sequences it builds on the way (``RENDER_MADE``: a loop that stored a large
string each time held gigabytes within the time budget), and operations, string methods
and filters that may not build a value far past the output budget at once. Past a budget it raises
``BudgetExceeded``. After a rendering that failed, once its values are gone, the C
allocator is told to hand freed memory back to the system (``release_memory``): what a
hostile template built is not kept.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from jinja2 import TemplateError, Undefined, nodes, pass_eval_context
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.filters import do_center, do_format, do_indent, do_join
from jinja2.nodes import EvalContext
from jinja2.sandbox import ImmutableSandboxedEnvironment

RENDER_SECONDS = 2.0  # time budget of one rendering
RENDER_BYTES = 8 * 1024 * 1024  # output budget of one rendering
RENDER_MADE = 64 * RENDER_BYTES  # characters (or items) of the values one rendering builds
RELEASE_AFTER = 8 * RENDER_BYTES  # what a failed rendering built before memory is handed back

_budget = threading.local()


class BudgetExceeded(TemplateError):
    pass


def check_deadline() -> None:
    end = getattr(_budget, "end", None)
    if end is not None and time.monotonic() > end:
        raise BudgetExceeded("the chat template took too long to render")


def _made(value: Any) -> Any:
    """``value``, counted against the rendering's RENDER_MADE when it is text or a
    sequence (what a template can pile up in a loop)."""
    if isinstance(value, (str, list, tuple, dict)) and getattr(_budget, "end", None):
        _budget.made += len(value)
        if _budget.made > RENDER_MADE:
            raise BudgetExceeded(f"the chat template built more than {RENDER_MADE >> 20} M "
                                 "characters of values")
    return value


@dataclass(slots=True)
class Spent:
    """What one rendering built (characters or items of values), known when it ends."""

    made: int = 0


@contextlib.contextmanager
def rendering(inputs: Any, spent: Spent) -> Iterator[None]:
    """The budgets of one rendering on this thread; ``inputs``: what the template is given
    (it may not change it); ``spent``: filled in when it ends."""
    _budget.end = time.monotonic() + RENDER_SECONDS
    _budget.inputs, _budget.made = containers(inputs), 0
    try:
        yield
    finally:
        spent.made = _budget.made
        _budget.end, _budget.inputs, _budget.made = None, None, 0


@functools.cache
def _libc() -> Any:
    return ctypes.CDLL(None)  # this process's symbols: glibc's malloc_trim where it has one


def release_memory(spent: Spent) -> None:
    """After a failed rendering that built much (RELEASE_AFTER), hand what it built
    back to the system: collect the cycles its exception's frames are in, then glibc's
    ``malloc_trim`` (nothing elsewhere); freed blocks otherwise stay in each thread's
    arena, and a template that built a gigabyte and failed kept the process that large.
    A rendering that built little costs nothing here (a 400 for bad roles is common)."""
    if spent.made <= RELEASE_AFTER:
        return
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # (no malloc_trim: not glibc)
        _libc().malloc_trim(0)


_WIDE = re.compile(r"%[-+ #0]*\d{7,}")  # a %-format padding a value to megabytes
_WIDE_FORMAT = re.compile(r"\{[^{}]*:[^{}]*\d{7,}")  # the same in str.format's syntax


def _too_big(op: str, left: Any, right: Any) -> bool:
    """Whether ``left op right`` would build a value far past the output budget (ints of
    more than 64k bits, strings / sequences longer than RENDER_BYTES)."""
    sized = (str, list, tuple)
    if op == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
        return right > 0 and right * abs(left).bit_length() > 1 << 16
    if op == "*":
        if isinstance(left, int) and isinstance(right, int):
            return left.bit_length() + right.bit_length() > 1 << 16
        seq, times = (left, right) if isinstance(left, sized) else (right, left)
        return isinstance(seq, sized) and isinstance(times, int) and len(seq) * times > RENDER_BYTES
    if op == "+" and isinstance(left, sized) and isinstance(right, sized):
        return len(left) + len(right) > RENDER_BYTES
    return op == "%" and isinstance(left, str) and _WIDE.search(left) is not None


def _method_too_big(obj: Any, args: tuple[Any, ...]) -> bool:
    """Whether a string method called with ``args`` would build a value past the output
    budget (``'x'.ljust(10**10)`` builds it before anything can count it)."""
    text, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
    if not isinstance(text, str):
        return False
    first = args[0] if args else 8  # (expandtabs' default)
    if name in ("ljust", "rjust", "center", "zfill", "expandtabs") and isinstance(first, int):
        return first * (text.count("\t") if name == "expandtabs" else 1) > RENDER_BYTES
    if name == "replace" and len(args) > 1 and isinstance(first, str) and isinstance(args[1], str):
        times = text.count(first) if first else len(text) + 1
        return len(text) + times * len(args[1]) > RENDER_BYTES
    return name == "join" and _joined_size(first, text) > RENDER_BYTES


def _joined_size(items: Any, sep: Any) -> int:
    """The length of ``items`` joined by ``sep`` (0 when they are not a list of texts)."""
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        return 0
    return sum(map(len, items)) + len(str(sep)) * max(len(items) - 1, 0)


def counted(f: Any) -> Any:
    """The filter ``f`` with its result counted against the values budget (the compiled
    template calls filters directly, not through ``call``)."""
    @functools.wraps(f)  # (keeps jinja's pass_context / pass_eval_context mark)
    def filtered(*args: Any, **kwargs: Any) -> Any:
        check_deadline()
        return _made(f(*args, **kwargs))
    return filtered


class _CheckedConcat(CodeGenerator):
    """``a ~ b`` through ``environment.checked_concat`` (the templates here never autoescape)."""

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.checked_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class BudgetedEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox, plus a deadline checked on every call and item access, and
    arithmetic that may not build values far larger than the output budget (a single
    ``7 ** 10**8`` or ``'a' * 10**10`` would hold the interpreter, deadline or not)."""

    intercepted_binops = frozenset({"**", "*", "+", "%"})
    code_generator_class = _CheckedConcat

    @staticmethod
    def checked_concat(parts: tuple[Any, ...]) -> str:
        check_deadline()
        text = "".join(map(str, parts))
        if len(text) > RENDER_BYTES:
            raise SecurityError("the chat template's '~' makes too large a value")
        _made(text)
        return text

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        check_deadline()
        # text + an undefined value is the text, as llama.cpp renders it (Command R+ adds
        # each tool parameter's description, which clients often leave out)
        text = left if isinstance(right, Undefined) else right
        if operator == "+" and isinstance(text, str) and Undefined in map(type, (left, right)):
            return text
        if _too_big(operator, left, right):
            raise SecurityError(f"the chat template's {operator!r} makes too large a value")
        return _made(super().call_binop(context, operator, left, right))

    def wrap_str_format(self, value: Any) -> Any:
        fmt = super().wrap_str_format(value)
        if fmt is not None and _WIDE_FORMAT.search(value.__self__):
            raise SecurityError("the chat template's format pads a value too far")
        return fmt

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        check_deadline()
        if _method_too_big(obj, args):
            raise SecurityError(f"the chat template's {obj.__name__}() makes too large a value")
        return _made(super().call(context, obj, *args, **kwargs))

    def getitem(self, obj: Any, argument: Any) -> Any:
        check_deadline()
        return super().getitem(obj, argument)

    def getattr(self, obj: Any, attribute: str) -> Any:
        check_deadline()
        return super().getattr(obj, attribute)

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        """The immutable sandbox's rule, except that the template may grow and shrink the
        lists, dicts and sets it made itself (Kimi K2's queue of call ids) one item at a
        time; what it was given stays immutable."""
        inputs = getattr(_budget, "inputs", None)  # None: not inside a rendering
        if inputs is not None and attr in SCRATCH.get(type(obj), ()) and id(obj) not in inputs:
            return True
        return super().is_safe_attribute(obj, attr, value)


# the mutating methods allowed on a template's own containers (none that copies a whole one)
SCRATCH: dict[type, frozenset[str]] = {
    list: frozenset({"append", "pop", "insert", "remove"}),
    dict: frozenset({"pop", "setdefault"}), set: frozenset({"add", "discard", "remove"})}


def containers(value: Any) -> set[int]:
    """The ids of the lists, dicts and sets in ``value``, however deep (no recursion:
    a call's arguments may nest as deep as JSON allows)."""
    found: set[int] = set()
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, (list, tuple, set, frozenset, dict)) and id(item) not in found:
            found.add(id(item))
            todo.extend(item.values() if isinstance(item, dict) else item)
    return found


def center(value: Any, width: int = 80) -> str:
    if isinstance(width, int) and width > RENDER_BYTES:
        raise SecurityError("the chat template centers a value too widely")
    return do_center(value, width)


def indent(s: Any, width: int | str = 4, first: bool = False, blank: bool = False) -> str:
    if isinstance(width, int) and width * (str(s).count("\n") + 1) > RENDER_BYTES:
        raise SecurityError("the chat template indents a value too far")
    return do_indent(s, width, first, blank)


@pass_eval_context
def join(eval_ctx: EvalContext, value: Any, d: str = "", attribute: Any = None) -> str:
    if _joined_size(value, d) > RENDER_BYTES:
        raise SecurityError("the chat template's join makes too large a value")
    return str(do_join(eval_ctx, value, d, attribute))


def format_filter(value: Any, *args: Any, **kwargs: Any) -> str:
    if isinstance(value, str) and _WIDE.search(value):
        raise SecurityError("the chat template's format pads a value too far")
    return do_format(value, *args, **kwargs)
