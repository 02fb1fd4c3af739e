"""A declared tool, and the context a handler may ask for."""
from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from ._schema import JsonSchema, Signature

# A result awaited this many times and still awaitable is a chain no handler means to return.
_MAX_AWAITS = 16


class ToolRaised(Exception):
    """A handler raised a ``BaseException`` that is not an ``Exception`` (``SystemExit``…), carried
    as an ``Exception`` so that it stays the call's failure instead of leaving the event loop."""

    def __init__(self, raised: BaseException) -> None:
        super().__init__(type(raised).__name__)
        self.raised = raised


class CallContext:
    """What a handler gets besides its arguments: annotate one parameter with ``CallContext``.

    - ``name``, ``call_id``: the tool and the model's call id (``x-toolport-call-id``).
    - ``deadline_ms``: Toolport's ``x-toolport-deadline-ms`` (else the tool's timeout), counted
      from when the call arrived; ``remaining()`` is what is left of it, in seconds.
    - ``cancelled``: a ``threading.Event`` set when the call is abandoned (deadline passed, or
      Toolport closed the connection); ``cancel_reason`` is ``"deadline"`` or ``"disconnected"``.
      An ``async`` handler is cancelled (``asyncio.CancelledError``) at that moment; a plain
      function runs in a worker thread, which Python cannot interrupt, so a long one should check
      ``ctx.cancelled`` and return early.

    Example::

        @plugin.tool()
        async def slow(query: str, ctx: CallContext) -> str:
            return await search(query, timeout=ctx.remaining())
    """

    __slots__ = ("name", "call_id", "deadline_ms", "cancelled", "cancel_reason", "_deadline_at")

    def __init__(self, name: str, call_id: str, deadline_ms: int) -> None:
        self.name = name
        self.call_id = call_id
        self.deadline_ms = deadline_ms
        self.cancelled = threading.Event()
        self.cancel_reason: str | None = None
        self._deadline_at = time.monotonic() + deadline_ms / 1000

    def remaining(self) -> float:
        """Seconds left before the deadline (0 once it has passed)."""
        return max(0.0, self._deadline_at - time.monotonic())

    def _cancel(self, reason: str) -> None:
        if not self.cancelled.is_set():
            self.cancel_reason = reason
            self.cancelled.set()


@dataclass(frozen=True)
class Tool:
    """A tool as declared with ``@plugin.tool``."""

    name: str
    description: str
    fn: Callable[..., Any]
    signature: Signature
    timeout_seconds: float

    @property
    def parameters(self) -> JsonSchema:
        """The JSON Schema registered with Toolport."""
        return self.signature.schema

    @property
    def is_async(self) -> bool:
        fn = self.fn
        while isinstance(fn, functools.partial):  # iscoroutinefunction() sees through a partial only to a function
            fn = fn.func
        return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))

    def invoke(self, kwargs: dict[str, Any], ctx: CallContext, executor: Executor) -> asyncio.Future[Any]:
        """Starts the handler as a task of its own (a plain function in a thread of ``executor``)."""
        if self.signature.context_param is not None:
            kwargs = {**kwargs, self.signature.context_param: ctx}
        return asyncio.ensure_future(self._run(kwargs, executor))

    async def _run(self, kwargs: dict[str, Any], executor: Executor) -> Any:
        try:
            return await self._call(kwargs, executor)
        except (Exception, asyncio.CancelledError):
            raise
        except KeyboardInterrupt as err:
            # In a worker thread it can only be the tool's own; in the event loop's thread it may
            # be the user's Ctrl-C, which must stop the program.
            if self.is_async:
                raise
            raise ToolRaised(err) from None
        except BaseException as err:
            # SystemExit (a tool calling sys.exit), GeneratorExit, a BaseException of its own: a
            # Task lets SystemExit out of the event loop, which would end the whole plugin (and a
            # host embedding it). The tool failed; the model reads it as any other failure.
            raise ToolRaised(err) from None

    async def _call(self, kwargs: dict[str, Any], executor: Executor) -> Any:
        if self.is_async:
            result = self.fn(**kwargs)
        else:
            # The context variables are copied, as asyncio.to_thread does, so logging context
            # and the like carry over.
            run = functools.partial(contextvars.copy_context().run, self.fn, **kwargs)
            result = await asyncio.get_running_loop().run_in_executor(executor, run)
        # The result is awaited whatever returned it (a lambda returning a coroutine, an async
        # def that forgot an await), as the TypeScript SDK awaits a handler's result (README
        # "Python plugin SDK": it does the same as the TypeScript SDK).
        for _ in range(_MAX_AWAITS):
            if not inspect.isawaitable(result):
                return result
            result = await result
        if inspect.iscoroutine(result):
            result.close()  # not reported as never awaited: the error below says what happened
        raise TypeError(f"the handler's result is still awaitable after {_MAX_AWAITS} awaits")
