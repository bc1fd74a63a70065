"""Eager start: run a coroutine's first step at once, and pay for a timeout only if it suspends.

Most interceptors finish without ever waiting on I/O. Starting them eagerly (what Python 3.12's
eager task factory does) keeps the event loop out of the call path for them; a coroutine that does
suspend continues under the same timeout, in the same task. A timeout cannot cut a step that never
yields in either case, so nothing is lost. Tool bodies are not started this way: they run as their
own task from the first step (see `Gate._run_tool`).
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
