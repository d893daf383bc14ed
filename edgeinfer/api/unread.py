"""Streams closed because their client stopped reading.

A stream that its client has not read for the server's ``send_timeout`` is closed on
purpose (``Stream`` and ``NdjsonStream`` log a warning), which leaves its response
incomplete. uvicorn then logs "ASGI callable returned without completing response" as an
error; for such a request that line says nothing new, so ``mark`` notes it and the filter
``install`` puts on uvicorn's logger drops it (for that request only: uvicorn logs it in
the request's own task, after the app returned).
"""

from __future__ import annotations

import logging
from contextvars import ContextVar

_closed: ContextVar[bool] = ContextVar("edgeinfer_closed_unread", default=False)
_INCOMPLETE = "ASGI callable returned without completing response"


def mark() -> None:
    """This request's stream was closed for not being read (in the request's task)."""
    _closed.set(True)


def _not_after_unread(record: logging.LogRecord) -> bool:
    return not (_closed.get() and record.getMessage().startswith(_INCOMPLETE))


def install() -> None:
    """Put the filter on uvicorn's error logger (once)."""
    logger = logging.getLogger("uvicorn.error")
    if _not_after_unread not in logger.filters:
        logger.addFilter(_not_after_unread)
