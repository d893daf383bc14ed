"""The grammar budget: what a JSON schema or a GBNF grammar may ask of llama.cpp.

llama.cpp's grammar parser recurses once per nested group and expands every
repetition into rules, so a single request could otherwise overflow the
native stack (``{"type": "string", "maxLength": 30000}`` becomes 30,000
nested optional groups) or allocate hundreds of megabytes
(``"minLength": 1500000``). Everything here is checked in pure Python, before
any text reaches llama.cpp, and refused with a 400 that names the limit.

The limits stay far inside llama.cpp's breaking points, measured with
``scripts/grammar_limits.py`` (one run, SmolLM2's vocabulary): 1,000 nested groups
compiled in 11 ms, 2,000-10,000 were refused by llama.cpp, 20,000 killed the process
with SIGSEGV (stack overflow in the parser); 1,000 repetitions ``{0,1000}`` in one
grammar took 1.3 s and 218 MB, 100 took 0.1 s and 18 MB.
"""

from __future__ import annotations

import math
import re
from typing import Any

from edgeinfer.errors import InvalidRequest

MAX_REPEAT = 1000  # any count: minLength, maxLength, minItems, maxItems, {m,n} in patterns
MAX_PATTERN_CHARS = 1000  # length of a schema's "pattern"
MAX_PATTERN_COST = 4000  # atoms a pattern stands for, counts multiplied through its groups
MAX_GBNF_BYTES = 64 * 1024  # a grammar written by the client
MAX_GENERATED_BYTES = 512 * 1024  # a grammar generated from schemas and tools
MAX_GBNF_NESTING = 1200  # groups inside groups (a maxLength of 1000 nests 1000 deep)
MAX_GBNF_RULES = 50_000  # rules, after llama.cpp expands every repetition (~5 MB)
MAX_SCHEMA_DEPTH = 32
MAX_SCHEMA_BYTES = 64 * 1024

COUNT_KEYWORDS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties",
                  "maxProperties")
# an upper count past MAX_REPEAT is taken as MAX_REPEAT (``conjunction`` writes it so):
# what the grammar writes still satisfies it (pydantic's HttpUrl says maxLength 2083)
UPPER_COUNTS = ("maxLength", "maxItems", "maxProperties")
NUMBER_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")

_QUANT = re.compile(r"\{\s*(\d+)\s*(?:(,)\s*(\d*)\s*)?\}")
_LITERALS = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|#[^\n]*')


def _finite(v: int | float) -> bool:
    """(an int past a float's range is finite, and ``math.isfinite`` overflows on it)"""
    return isinstance(v, int) or math.isfinite(v)


def check_schema_node(node: dict[str, Any], param: str) -> None:
    """Counts are non-negative integers up to MAX_REPEAT, bounds are finite numbers,
    patterns are short and expand to little (one sub-schema; the caller walks them)."""
    for key in COUNT_KEYWORDS:
        if key not in node:
            continue
        v = node[key]
        if isinstance(v, bool) or not isinstance(v, int | float) or not _finite(v) or (
                v < 0 or v != int(v)):
            raise InvalidRequest(f"'{key}' must be a non-negative integer", param=param)
        if v > MAX_REPEAT and key not in UPPER_COUNTS:
            shown = int(v) if v < 10 ** 12 else "larger"
            raise InvalidRequest(f"'{key}' is {shown}; this server allows at most {MAX_REPEAT} "
                                 "(grammar budget: repetition count)", param=param,
                                 code="grammar_too_large")
    for key in NUMBER_KEYWORDS:
        v = node.get(key)
        if v is None or isinstance(v, bool) and key.startswith("exclusive"):
            continue  # draft-4 style exclusiveMinimum: true
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise InvalidRequest(f"'{key}' must be a finite number", param=param)
        if not _finite(v) or abs(v) > 1e300:
            what = "is out of range" if _finite(v) else "must be a finite number"
            raise InvalidRequest(f"'{key}' {what}", param=param, code="grammar_too_large")
    for low, high in (("minLength", "maxLength"), ("minItems", "maxItems"),
                      ("minProperties", "maxProperties"), ("minimum", "maximum")):
        if isinstance(node.get(low), int | float) and isinstance(node.get(high), int | float) \
                and node[low] > node[high]:
            raise InvalidRequest(f"'{low}' ({node[low]}) is greater than '{high}' "
                                 f"({node[high]}): nothing satisfies the schema", param=param)
    pattern = node.get("pattern")
    if pattern is not None:
        if not isinstance(pattern, str):
            raise InvalidRequest("'pattern' must be a string", param=param)
        check_pattern(pattern, param)


def pattern_cost(pattern: str) -> int:
    """How many atoms a regular expression stands for once every counted repetition is
    written out (what llama-cpp-python's converter does): counts multiply through groups."""
    stack: list[int] = [0]  # the cost of each open group so far
    last = 0  # cost of the last atom or group, which a quantifier multiplies
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            stack[-1] += 1
            last = 1
            continue
        if c == "[":
            j = i + 1
            if j < n and pattern[j] == "^":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            i = j + 1
            stack[-1] += 1
            last = 1
            continue
        if c == "(":
            stack.append(0)
            i += 1
            last = 0
            continue
        if c == ")":
            inner = stack.pop() if len(stack) > 1 else 0
            stack[-1] += inner
            last = inner
            i += 1
            continue
        if c == "{":
            m = _QUANT.match(pattern, i)
            if m:
                lo = int(m.group(1))
                hi = lo if m.group(2) is None else int(m.group(3)) if m.group(3) else lo + 1
                count = max(lo, hi, 1)
                if count > MAX_REPEAT:
                    return count * max(last, 1)
                stack[-1] += last * (count - 1)
                last *= count
                i = m.end()
                continue
        stack[-1] += 1
        last = 1
        i += 1
    return sum(stack)


def check_pattern(pattern: str, param: str) -> None:
    if len(pattern) > MAX_PATTERN_CHARS:
        raise InvalidRequest(f"'pattern' is longer than {MAX_PATTERN_CHARS} characters "
                             "(grammar budget)", param=param, code="grammar_too_large")
    for m in _QUANT.finditer(pattern):
        for g in (m.group(1), m.group(3)):
            if g and int(g) > MAX_REPEAT:
                raise InvalidRequest(f"'pattern' repeats {int(g)} times; this server allows at "
                                     f"most {MAX_REPEAT} (grammar budget: repetition count)",
                                     param=param, code="grammar_too_large")
    cost = pattern_cost(pattern)
    if cost > MAX_PATTERN_COST:
        raise InvalidRequest(f"'pattern' expands to {cost} elements; this server allows at most "
                             f"{MAX_PATTERN_COST} (grammar budget)", param=param,
                             code="grammar_too_large")
    check_nullable_pattern(pattern, param)


def check_gbnf_budget(gbnf: str, param: str, *, generated: bool) -> None:
    """Size, nesting, repetition counts and rule count of a GBNF grammar, before llama.cpp
    sees it. ``generated``: made by us from a schema or tools (a larger size is allowed)."""
    limit = MAX_GENERATED_BYTES if generated else MAX_GBNF_BYTES
    if len(gbnf) > limit:
        what = "the grammar made from this schema" if generated else "the grammar"
        raise InvalidRequest(f"{what} is larger than {limit} bytes (grammar budget)",
                             param=param, code="grammar_too_large")
    plain = _LITERALS.sub('""', gbnf)
    depth = deepest = 0
    for ch in plain:
        if ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
    if deepest > MAX_GBNF_NESTING:
        raise InvalidRequest(f"the grammar nests {deepest} groups deep; this server allows at "
                             f"most {MAX_GBNF_NESTING} (grammar budget)", param=param,
                             code="grammar_too_large")
    rules = plain.count("::=") + plain.count("(") + plain.count("|")
    for m in _QUANT.finditer(plain):
        lo = int(m.group(1))
        hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else lo + 1)
        if max(lo, hi) > MAX_REPEAT:
            raise InvalidRequest(f"the grammar repeats an element {max(lo, hi)} times; this "
                                 f"server allows at most {MAX_REPEAT} (grammar budget)",
                                 param=param, code="grammar_too_large")
        rules += max(lo, hi)
    rules += plain.count("*") + plain.count("+") + plain.count("?")
    if rules > MAX_GBNF_RULES:
        raise InvalidRequest(f"the grammar expands to about {rules} rules; this server allows "
                             f"at most {MAX_GBNF_RULES} (grammar budget)", param=param,
                             code="grammar_too_large")
    check_nullable_repeats(gbnf, param)


MAX_NULLABLE_REPEAT = 50  # a counted repetition of what may match nothing (see below)
_TOKEN = re.compile(r'""|~|[a-zA-Z0-9_-]+|\{[^}]*\}|[()|?*+]|\.')
_REGEX_TOKEN = re.compile(r"\\.|\[(?:[^\]\\]|\\.)*\]|\(\?[:=!]?|\{[^}]*\}|[()|?*+]|[^\\]")
_RULE = re.compile(r"^\s*([a-zA-Z0-9_-]+)\s*::=", re.MULTILINE)

_Item = tuple[object, str]  # (atom: a rule name, '""' or a group of alternatives, quantifier)


def _parse(tokens: list[str], i: int) -> tuple[list[list[_Item]], int]:
    """Alternatives of items from ``tokens[i]`` to the closing parenthesis (or the end).
    Iterative: a grammar may nest groups deeper than Python's recursion limit."""
    stack: list[list[list[_Item]]] = [[[]]]  # the open groups, innermost last
    while i < len(tokens):
        tok = tokens[i]
        if tok == "|":
            stack[-1].append([])
            i += 1
            continue
        if tok == "(":
            stack.append([[]])
            i += 1
            continue
        if tok == ")" and len(stack) == 1:
            break
        atom: object = stack.pop() if tok == ")" else tok
        i += 1
        quant = ""
        if i < len(tokens) and (tokens[i] in "?*+" or tokens[i].startswith("{")):
            quant, i = tokens[i], i + 1
        stack[-1][-1].append((atom, quant))
    while len(stack) > 1:  # groups left open at the end
        group = stack.pop()
        stack[-1][-1].append((group, ""))
    return stack[0], i


def _nullable(atom: object, quant: str, names: set[str],
              known: dict[int, bool] | None = None) -> bool:
    """Whether ``atom`` with ``quant`` may match nothing (``names``: the rules that may).
    Groups are judged innermost first, without recursion; ``known`` keeps the verdicts."""
    if _may_skip(quant):
        return True
    if not isinstance(atom, list):
        return atom == "~" or atom in names
    known = {} if known is None else known
    todo: list[tuple[list[list[_Item]], bool]] = [(atom, False)]
    while todo:
        group, ready = todo.pop()
        if id(group) in known:
            continue
        if not ready:
            todo.append((group, True))
            todo.extend((a, False) for alt in group for a, _ in alt
                        if isinstance(a, list) and id(a) not in known)
            continue
        known[id(group)] = any(all(
            (_may_skip(q) or (known[id(a)] if isinstance(a, list) else a == "~" or a in names))
            for a, q in alt) for alt in group)
    return known[id(atom)]


def _may_skip(quant: str) -> bool:
    """A quantifier that lets its atom match nothing."""
    return quant in ("?", "*") or re.fullmatch(r"\{\s*0\s*(,.*)?\}", quant) is not None


def _too_many(alts: list[list[_Item]], names: set[str], param: str) -> None:
    todo = list(alts)
    known: dict[int, bool] = {}
    while todo:
        for atom, quant in todo.pop():
            if isinstance(atom, list):
                todo.extend(atom)
            counts = [int(n) for n in re.findall(r"\d+", quant)] if quant[:1] == "{" else []
            if counts and max(counts) > MAX_NULLABLE_REPEAT and _nullable(atom, "", names,
                                                                           known):
                raise InvalidRequest(
                    f"the grammar repeats an element that may match nothing {max(counts)} "
                    f"times; this server allows at most {MAX_NULLABLE_REPEAT} (grammar budget)",
                    param=param, code="grammar_too_large")


def check_nullable_pattern(pattern: str, param: str) -> None:
    """``check_nullable_repeats`` for a schema's regular expression (the converter expands
    its counts into nested optional groups, just as costly): ``(a?){0,1000}``."""
    tokens = ["(" if t.startswith("(") else t if t in "()|?*+" or t[:1] == "{" else '""'
              for t in _REGEX_TOKEN.findall(pattern)]
    _too_many(_parse(tokens, 0)[0], set(), param)


def check_rewritten_pattern(pattern: str, rewritten: str, param: str) -> None:
    """``check_nullable_pattern`` for the pattern as the converter gets it: ``*`` and ``+``
    have become counts there (``pattern.MAX_REPEAT``), so ``(a?b?)*`` is as costly as
    ``(a?b?){0,200}`` (8 minutes for 9 tokens, every request of the model waiting)."""
    try:
        check_nullable_pattern(rewritten, param)
    except InvalidRequest:
        raise InvalidRequest(
            f"'pattern' {pattern[:100]!r} repeats with * or + a group that may match nothing; "
            f"make what it repeats match at least one character, or give it a count of at "
            f"most {MAX_NULLABLE_REPEAT} (grammar budget)", param=param,
            code="grammar_too_large") from None


MAX_LEFT_VISITS = 1_000_000  # rule visits of llama.cpp's left-recursion check (~10 ms)


def _lead(alt: list[_Item], rules: dict[str, list[list[_Item]]]) -> list[tuple[Any, int]]:
    """(rule or group, copies) that llama.cpp's left-recursion check enters from ``alt``:
    the first, and the next ones while those before may be empty (an empty alternative of
    their own, or a quantifier that may skip them; ``S{4}`` of an S that may be empty is
    four copies, each walked)."""
    out: list[tuple[Any, int]] = []
    for atom, quant in alt:
        if atom == "~":  # an empty literal is no element
            continue
        if atom == '""':  # a terminal ends the leading part, unless it may be skipped
            if _may_skip(quant):
                continue
            return out
        group = atom if isinstance(atom, list) else rules.get(str(atom), [[('""', "")]])
        empty = any(all(a == "~" for a, _ in g) for g in group)
        counts = [int(n) for n in re.findall(r"\d+", quant)] if quant[:1] == "{" else [1]
        out.append((group, max(1, max(counts)) if empty else 1))
        if not (_may_skip(quant) or empty):
            return out
    return out


def _groups(rules: dict[str, list[list[_Item]]]) -> list[list[list[_Item]]]:
    """Every rule, in order, then every group (llama.cpp makes a rule of each): what its
    check walks from."""
    out, todo = list(rules.values()), list(rules.values())
    while todo:
        node = todo.pop()
        groups = [a for alt in node for a, _ in alt if isinstance(a, list)]
        out += groups
        todo += groups
    return out


def check_left_visits(rules: dict[str, list[list[_Item]]], param: str) -> None:
    """llama.cpp checks a grammar for left recursion by walking each rule's leading rule
    references without remembering the rules it walked, so a chain of rules each with
    several alternatives leading to the next takes time exponential in its length (15
    levels of 4 ``$ref``s to the next definition: hours, on the model's engine thread).
    The walks from every rule are counted here (memoized) and refused past
    MAX_LEFT_VISITS in all."""
    visits: dict[int, int] = {}  # by id of a rule's or group's alternatives
    busy: set[int] = set()  # being walked (a cycle back to one adds nothing)
    total = 0
    for top in _groups(rules):
        if id(top) in visits:  # reached by an earlier rule's walk: llama.cpp skips those
            continue
        todo: list[tuple[list[list[_Item]], bool]] = [(top, False)]
        while todo:
            node, ready = todo.pop()
            if id(node) in visits or (not ready and id(node) in busy):
                continue
            kids = [k for alt in node for k in _lead(alt, rules)]
            if not ready:
                busy.add(id(node))
                todo.append((node, True))
                todo.extend((k, False) for k, _ in kids
                            if id(k) not in visits and id(k) not in busy)
                continue
            busy.discard(id(node))
            visits[id(node)] = min(1 + sum(n * visits.get(id(k), 0) for k, n in kids),
                                   MAX_LEFT_VISITS + 1)
        total += visits[id(top)]
        if total > MAX_LEFT_VISITS:
            raise InvalidRequest(
                "the grammar's rules branch into each other too many times before any text "
                "(llama.cpp's check of it would take hours): fewer alternatives that each "
                "lead to the next, or fewer levels of them (grammar budget)", param=param,
                code="grammar_too_large")


def check_nullable_repeats(gbnf: str, param: str) -> None:
    """llama.cpp's grammar engine takes time cubic in the count to accept each token of a
    counted repetition of something that may match nothing: ``("a"?){0,1000}`` took
    minutes per token (0.2 s at 100, 19 s at 400), stalling every request of the model.
    Such counts are kept to MAX_NULLABLE_REPEAT."""
    plain = _LITERALS.sub(lambda m: "~" if m.group(0) == '""' else
                          " " if m.group(0).startswith("#") else '""', gbnf)
    starts = list(_RULE.finditer(plain))
    rules = {m.group(1): _parse(['""' if t == "." else t  # (any character: a terminal)
                                 for t in _TOKEN.findall(plain[m.end():nxt])], 0)[0]
             for m, nxt in zip(starts, [s.start() for s in starts[1:]] + [len(plain)],
                               strict=False)}
    names: set[str] = set()
    while True:  # the rules that may match nothing, to a fixpoint
        more = {n for n, alts in rules.items() if n not in names and _nullable(alts, "", names)}
        if not more:
            break
        names |= more
    _too_many([alt for alts in rules.values() for alt in alts], names, param)
    check_left_visits(rules, param)
