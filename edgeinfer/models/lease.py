"""Who is using a loaded model: users of its native handles (``Lease``) and admitted
engine requests that have not started yet (``Places``)."""

from __future__ import annotations

import threading
from typing import Protocol


class Users:
    """How many callers are using a model's native handles right now (thread-safe).

    Taken on the event loop before any work starts and given back by whoever
    finishes last (a worker thread, for blocking native calls), so a model is
    never freed while anything can still touch it.
    """

    def __init__(self) -> None:
        self._n = 0
        self._lock = threading.Lock()

    def take(self) -> None:
        with self._lock:
            self._n += 1

    def give_back(self) -> None:
        with self._lock:
            assert self._n > 0, "a model's user count went below zero"
            self._n -= 1

    @property
    def count(self) -> int:
        return self._n


class Lease:
    """One use of a loaded model; ``release`` (idempotent) ends it."""

    __slots__ = ("_users",)

    def __init__(self, users: Users) -> None:
        users.take()
        self._users: Users | None = users

    def release(self) -> None:
        if self._users is not None:
            self._users.give_back()
            self._users = None


class Places(Lease):
    """Admitted engine requests whose streams have not started yet: they count against
    the model's queue bound from admission on (a burst of requests cannot all pass the
    check before any of them is counted). A stream that starts takes one place
    (``take``); ``release`` (idempotent, with the request's other leases) gives back the
    places of streams that never started."""

    __slots__ = ("_model", "_left")

    def __init__(self, model: Counted, n: int) -> None:
        super().__init__(model.users)
        self._model: Counted | None = model
        self._left = n
        model.reserved += n

    def take(self) -> None:
        if self._model is not None and self._left > 0:
            self._left -= 1
            self._model.reserved -= 1

    def release(self) -> None:
        if self._model is not None:
            self._model.reserved -= self._left
            self._left = 0
            self._model = None
        super().release()


class Counted(Protocol):
    """What ``Places`` counts on: the model's users and its count of reserved places."""

    users: Users
    reserved: int
