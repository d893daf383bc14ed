"""String ``format``s the converter has no rule for, written as patterns (``as_pattern``).

llama-cpp-python's converter writes ``date``, ``time``, ``date-time`` and ``uuid``; any
other format it ignored, silently: an ``email`` field (pydantic's ``EmailStr``) could be
``"Euclid"``, an ``ipv4`` a date. Here the common ones become a pattern that matches
some of their values (never one a validator of the format refuses): plain forms of
bounded length, so that the string still ends before max_tokens. A format beside a
``pattern``, or whose pattern no string within the node's ``minLength`` / ``maxLength``
matches, and any other format, is logged as not enforced (the rest of the schema holds).
"""

from __future__ import annotations

import logging
from typing import Any

from edgeinfer.prompt.pattern import with_lengths

log = logging.getLogger("edgeinfer.prompt")

_LABEL = "[a-z0-9]{1,20}(-[a-z0-9]{1,20}){0,2}"  # a host name's label, lower case
# a top-level domain from a list: validators refuse reserved ones (test, local, localhost)
# and all-digit ones
_TLD = "(com|org|net|io|dev|app|ai|co|edu|gov|uk|de|fr|jp)"
_HOST = f"({_LABEL}\\.){{1,3}}{_TLD}"
_OCTET = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_URI = f"^https?://{_HOST}(/[a-zA-Z0-9._~-]{{1,30}}){{0,6}}/?$"

_EMAIL = f"^[a-z0-9]{{1,20}}([._+-][a-z0-9]{{1,20}}){{0,2}}@{_HOST}$"

PATTERNS = {
    "email": _EMAIL,
    "idn-email": _EMAIL,
    "hostname": f"^{_HOST}$",
    "idn-hostname": f"^{_HOST}$",
    "ipv4": f"^{_OCTET}(\\.{_OCTET}){{3}}$",
    "ipv6": "^[0-9a-f]{1,4}(:[0-9a-f]{1,4}){7}$",
    "uri": _URI,
    "iri": _URI,
    "uri-reference": _URI,
    "iri-reference": _URI,
    "duration": "^P([0-9]{1,4}D)?T[0-9]{1,2}H[0-9]{1,2}M[0-9]{1,2}S$",  # (RFC 3339's)
}
# formats the converter writes itself (``uuid1`` .. ``uuid5`` too)
CONVERTER_FORMATS = {"date", "time", "date-time", "uuid"}


def written_format(fmt: Any) -> bool:
    """Whether the converter writes the string ``format`` ``fmt`` itself (a rule of
    bounded length); it ignores any other, leaving the string unbounded."""
    return isinstance(fmt, str) and (fmt in CONVERTER_FORMATS or fmt.startswith("uuid"))


def as_pattern(node: dict[str, Any]) -> dict[str, Any]:
    """``node`` with a ``format`` the converter does not write made its pattern (see the
    module docstring); other nodes as they are."""
    fmt = node.get("format")
    if not isinstance(fmt, str) or written_format(fmt):
        return node
    pattern = PATTERNS.get(fmt)
    if pattern and "pattern" not in node:
        try:
            with_lengths(pattern, node.get("minLength") or 0, node.get("maxLength"))
        except (ValueError, TypeError):
            pass  # (no string of the pattern has those lengths: the format is dropped)
        else:
            return {**{k: v for k, v in node.items() if k != "format"}, "pattern": pattern}
    log.warning("a JSON schema format is not enforced: %r", fmt[:100])
    return node
