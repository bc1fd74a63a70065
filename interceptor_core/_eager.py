"""Eager start: run a coroutine's first step at once, and pay for a timeout or a task only if it
suspends.

Most interceptors and many tools finish without ever waiting on I/O. Starting them eagerly (what
Python 3.12's eager task factory does) keeps the event loop out of the call path for them; a
coroutine that does suspend continues under the same timeout, in its own task where asked. A
timeout cannot cut a step that never yields in either case, so nothing is lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from types import CoroutineType
from typing import Any


class _Continue:
    """Awaitable that resumes a coroutine already started elsewhere, from its pending yield."""

    __slots__ = ("coro", "pending")

    def __init__(self, coro: Coroutine[Any, Any, Any], pending: Any) -> None:
        self.coro = coro
        self.pending = pending

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, pending = self.coro, self.pending
        while True:
            try:
                sent = yield pending
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # cancellation included: the coroutine decides
                try:
                    pending = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    pending = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


_NOT_STARTED = object()


def start(awaitable: Any) -> tuple[bool, Any]:
    """Run a coroutine's first step now: `(True, result)` if it finished, else `(False, pending)`
    to hand to `finish`. Anything else that can be awaited is returned unstarted. Raises what the
    step raises."""
    if type(awaitable) is CoroutineType:
        try:
            return False, awaitable.send(None)
        except StopIteration as stop:
            return True, stop.value
    return False, _NOT_STARTED


async def finish(awaitable: Any, pending: Any, limit_s: float) -> Any:
    """Await the rest of what `start` left pending, within `limit_s` seconds."""
    async with asyncio.timeout(limit_s):
        if pending is _NOT_STARTED:
            return await awaitable
        return await _Continue(awaitable, pending)


class Resumed(Coroutine[Any, Any, Any]):
    """A coroutine started eagerly, as a coroutine object a task can drive from its pending yield.

    The task's first step gets the pending yield back; after that every `send` and `throw` goes
    straight to the started coroutine. A cancellation that arrives before the task's first step is
    therefore thrown into the started coroutine, which can clean up, rather than into a wrapper
    that never ran.
    """

    __slots__ = ("_coro", "_first", "_pending")

    def __init__(self, coro: Coroutine[Any, Any, Any], pending: Any) -> None:
        self._coro = coro
        self._pending = pending
        self._first = True

    def send(self, value: Any) -> Any:
        if self._first:
            self._first = False
            return self._pending
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        self._first = False
        if val is None and tb is None:
            return self._coro.throw(typ)
        return self._coro.throw(typ, val, tb)  # pragma: no cover - the three-argument form is deprecated

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, Any, Any]:
        return _Continue(self._coro, self._pending).__await__()
