"""Eager start: run a coroutine's first step at once, and pay for a timeout only if it suspends.

Most interceptors finish without ever waiting on I/O. Starting them eagerly (what Python 3.12's
eager task factory does) keeps the event loop out of the call path for them; a coroutine that does
suspend continues under the same timeout, in the same task. A timeout cannot cut a step that never
yields in either case, so nothing is lost. Tool bodies start the same way, but step by step in
a context of their own (`InContext`), still in the calling task.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine, Generator
from types import CoroutineType
from typing import Any

_NOT_STARTED = object()


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


class InContext:
    """Awaitable that drives a coroutine step by step inside `context`, in the awaiting task, from its
    first step or, given `pending` (what its first step yielded), from its second.

    What a task of its own would give the coroutine (its own contextvars) without a task: it runs
    in the caller's task from its first step to its last, so cancel scopes and timeouts it enters
    are left in the task that entered them (anyio checks), and cancelling the caller cancels it.
    """

    __slots__ = ("context", "coro", "pending")

    def __init__(
        self, coro: Coroutine[Any, Any, Any], context: contextvars.Context, pending: Any = _NOT_STARTED
    ) -> None:
        self.coro = coro
        self.context = context
        self.pending = pending

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, run = self.coro, self.context.run
        pending = self.pending
        if pending is _NOT_STARTED:
            try:
                pending = run(coro.send, None)
            except StopIteration as stop:
                return stop.value
        while True:
            try:
                sent = yield pending
            except GeneratorExit:
                run(coro.close)
                raise
            except BaseException as exc:  # cancellation included: the coroutine decides
                try:
                    pending = run(coro.throw, exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    pending = run(coro.send, sent)
                except StopIteration as stop:
                    return stop.value


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
