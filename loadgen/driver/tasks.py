"""Request tasks of an open-loop run: plain asyncio tasks, owned and awaited by the scheduler.

anyio's ``TaskGroup.start_soon`` costs ~25 µs per task (a task handle, a cancel scope, weak
references), which at thousands of requests per second is a tenth of the driver's CPU. On asyncio the
scheduler starts each request as a bare ``loop.create_task`` instead and keeps the tasks itself; the
structure stays the same: ``join`` returns only when every task has ended, a stopped run (the
scheduler cancelled) cancels every task and waits for each to record its row, and a task that fails
stops the rest and raises its error. On another backend it is anyio's task group.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import anyio.abc

from .schedule import on_asyncio

__all__ = ["RequestTasks"]


class RequestTasks:
    """Start request tasks cheaply (``start``) and wait for all of them (``join``); see module docstring."""

    def __init__(self, group: anyio.abc.TaskGroup) -> None:
        self._group = group
        self._loop = asyncio.get_running_loop() if on_asyncio() else None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._error: BaseException | None = None

    def start(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        """Start ``fn(*args)`` now (the first step runs at the loop's next turn)."""
        if self._error is not None:
            raise self._error
        if self._loop is None:
            self._group.start_soon(fn, *args)
            return
        task: asyncio.Task[Any] = self._loop.create_task(fn(*args))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and self._error is None:
            self._error = task.exception()
            for other in self._tasks:
                other.cancel()

    async def join(self) -> None:
        """Wait until every task has ended (tasks started meanwhile too); raise the first task's error.

        Cancelled meanwhile (the run stops): cancel every task, wait for all of them, then re-raise.
        """
        try:
            while self._tasks:
                await asyncio.wait(list(self._tasks))
        except BaseException:
            for task in self._tasks:
                task.cancel()
            with anyio.CancelScope(shield=True):
                while self._tasks:
                    await asyncio.wait(list(self._tasks))
            raise
        if self._error is not None:
            raise self._error
