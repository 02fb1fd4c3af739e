"""The plugin's callback server (docs/protocol.md R9–R12, R14), on aiohttp.

aiohttp because it is the long-standing, actively maintained asyncio HTTP server *and* client: one
dependency serves Toolport's callbacks and talks to Toolport's API (and reads its event stream),
keep-alive is on by default, and its ``handler_cancellation`` cancels a request's handler when
the client hangs up — exactly what a cancelled call needs.

Every call that reaches a tool is answered HTTP 200 with the ``{output, is_error}`` envelope: an
HTTP error would also become a tool error (R12), but a worse one for the model. HTTP errors are
kept for requests that are not Toolport calls at all. Calls carry the user's conversation (R14),
so the server only answers Toolport: it binds a loopback address, every tool path carries a
128-bit random segment a web page cannot guess, the Host header must name loopback (DNS
rebinding), a browser's Origin header is refused, and bodies must be ``application/json``.

A tool's callback URL is ``<origin>/<secret>/tools/<name, percent-encoded>`` as in the TypeScript
SDK (but ``=.`` and ``=..`` for the names ``.`` and ``..``); the server routes by the raw path,
decoded once, so every 1–64 character name reaches its own handler.

aiohttp's connection handler is replaced by ``_RequestHandler``: its answer to a request it cannot
parse quotes the raw bytes around the error (which can hold an earlier call's arguments), and it
logs them with a traceback at ERROR level; ours answers a fixed text and logs neither. It also
parses one request at a time, so a call is answered before a malformed request behind it.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import math
import secrets
import sys
import traceback
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from typing import Any
from urllib.parse import quote, unquote

from aiohttp import web
from aiohttp.helpers import DEFAULT_CHUNK_SIZE
from aiohttp.http_parser import HttpRequestParser
from aiohttp.web_protocol import RequestHandler, RequestPayloadError
from aiohttp.web_request import BaseRequest

from ._json import decode
from ._loopback import is_loopback_host_header
from ._results import error_reply, exception_reply, output_reply
from ._schema import ArgumentsError
from ._tool import CallContext, Tool, ToolRaised
from .errors import LISTEN, PluginError

# Below Toolport's 4 s client keep-alive would race it; 5 s lets Toolport close idle sockets first.
_KEEPALIVE_SECONDS = 5.0
# A connection that has not sent a whole request head by then is closed (Toolport sends its call at
# once): aiohttp never times one out, so idle sockets of any local process would pile up until the
# plugin ran out of file descriptors and Toolport's calls could no longer connect.
_FIRST_REQUEST_SECONDS = 10.0
# aiohttp's shutdown timeout once close() has waited the grace itself: aiohttp bounds its shutdown
# waits with ceil_timeout(), which reads a timeout <= 0 as no timeout at all (calls in flight would
# run to their deadline); this is "at once" for it.
_AT_ONCE_SECONDS = 0.001
# Toolport's deadline runs out before the plugin's own clock says so, by the time the call took to
# arrive (more on a busy machine): a hang-up within this of the deadline (seconds; a quarter of a
# deadline shorter than four times this) is the deadline.
_DEADLINE_SLACK = 1.0
# The tool names that would be dot segments, which URL canonicalisation removes (Toolport's WHATWG
# parser, also when spelt %2e): their segment is "=" + the name. Percent-encoding never leaves a
# bare "=", so no other name's segment starts with one.
_DOT_SEGMENTS = (".", "..")
_DOT_MARK = "="


def _segment_of(name: str) -> str:
    """A tool's path segment: its name, UTF-8 percent-encoded but for ``A-Z a-z 0-9 - . _ ~``
    (so ``/``, ``%``, ``?``, ``#``, controls… are all escaped), or ``=.`` / ``=..`` for ``.`` / ``..``."""
    encoded = quote(name, safe="")
    return _DOT_MARK + encoded if encoded in _DOT_SEGMENTS else encoded


def _name_of(segment: str) -> str | None:
    """The name a raw (still percent-encoded) path segment routes to; None when it decodes to no
    text (bad UTF-8). Decodes exactly once, so a name's own ``%41`` stays ``%41``."""
    if segment.startswith(_DOT_MARK) and segment[1:] in _DOT_SEGMENTS:
        return segment[1:]
    try:
        return unquote(segment, errors="strict")
    except UnicodeDecodeError:
        return None


class CallbackServer:
    def __init__(self, host: str, port: int, max_body_bytes: int, tools: Mapping[str, Tool], logger: logging.Logger) -> None:
        self._host = host
        self._port = port
        self._max_body_bytes = max_body_bytes
        self._tools = tools
        self._log = logger
        self._prefix = f"/{secrets.token_urlsafe(16)}/tools/"
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._bound_port = 0
        # listen() and close() one at a time: a close() while listen() binds (stop() right after
        # start()) would clean up before the socket exists, and leave it listening.
        self._opening = asyncio.Lock()
        # The tasks of requests being handled: close() waits for them for the grace.
        self._in_flight: set[asyncio.Task[Any]] = set()
        # Sync handlers' threads (made by listen()): the SDK's own, not the loop's default
        # executor, where aiohttp resolves host names (python/README.md "Handlers"): blocking
        # handlers must not hold up the SDK's own requests to Toolport.
        self._executor: ThreadPoolExecutor | None = None

    @property
    def origin(self) -> str:
        """``http://host:port`` once listening (the origin Toolport's eviction counts by)."""
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._bound_port}" if self._bound_port else ""

    def callback_url(self, name: str) -> str:
        return f"{self.origin}{self._prefix}{_segment_of(name)}"

    async def listen(self) -> str:
        async with self._opening:
            # No max_workers: as many threads as the loop's default executor gets (concurrent.futures'
            # own min(32, CPUs + 4)), so a plugin runs as many sync calls at once as asyncio.to_thread
            # would; more wait for a thread (python/README.md "Handlers").
            self._executor = ThreadPoolExecutor(thread_name_prefix="toolport-tool")
            app = web.Application(client_max_size=self._max_body_bytes)
            # Every path: the SDK routes by name itself (_handle). "[\s\S]", as "." misses a line feed.
            app.router.add_route("*", r"/{tail:[\s\S]*}", self._handle)
            self._runner = _AppRunner(
                app, handler_cancellation=True, keepalive_timeout=_KEEPALIVE_SECONDS, access_log=None,
                # A compressed body is refused (_refusal), never inflated on the event loop first.
                auto_decompress=False,
                # Refused requests and the SDK's own failures go to the plugin's logger, not aiohttp's.
                logger=self._log,
            )
            await self._runner.setup()
            try:
                await self._bind(self._port)
            except OSError as err:
                # README "Python plugin SDK": the SDK raises PluginErrors only. A port in use stays
                # in use: start() does not retry this.
                code = errno.errorcode.get(err.errno or 0, "")
                where = f"[{self._host}]" if ":" in self._host else self._host
                raise PluginError(
                    LISTEN, f"the callback server cannot listen on {where}:{self._port}: {code or err.strerror or err}"
                    + (" (the port is in use)" if err.errno == errno.EADDRINUSE else ""),
                ) from err
            return self.origin

    async def _bind(self, port: int) -> None:
        assert self._runner is not None
        self._site = web.TCPSite(self._runner, self._host, port, reuse_address=True)
        await self._site.start()
        server = self._site._server  # the asyncio Server: the only place the bound port is known
        sockets = getattr(server, "sockets", None) or []
        self._bound_port = sockets[0].getsockname()[1] if sockets else port

    async def close(self, grace: float) -> None:
        """Stops accepting, lets calls in flight finish for ``grace`` seconds, then cancels them.

        The SDK waits the grace itself (README "Python plugin SDK" → Start and stop: calls in
        flight finish "for ``grace`` seconds"): aiohttp's shutdown timeout bounds two waits in a
        row (for the handler to finish, then for its connection's task), so as aiohttp's timeout
        the grace let a call run for twice as long. aiohttp then gets one that is "at once" for it.
        """
        async with self._opening:
            try:
                await self._close(grace)
            finally:
                if self._executor is not None:
                    # Calls in flight are answered or cancelled by now. A sync handler still
                    # running cannot be interrupted (README "Python plugin SDK" → Deadline and
                    # cancellation): stop() does not wait for its thread, and its result is dropped.
                    self._executor.shutdown(wait=False, cancel_futures=True)

    async def _close(self, grace: float) -> None:
        if self._runner is None:
            return
        runner, self._runner = self._runner, None
        for site in list(runner.sites):
            await site.stop()
        self._site = None
        # As aiohttp's own cleanup does: requests read before the sites stopped start their handling.
        await asyncio.sleep(0)
        server = runner.server
        if server is not None:
            # Each connection closes once its request is answered, an idle one at once: no
            # new request reaches a tool during the grace.
            for conn in list(server.connections):
                conn.close()
        in_flight = set(self._in_flight)
        if in_flight and grace > 0:  # also not NaN
            await asyncio.wait(in_flight, timeout=None if math.isinf(grace) else grace)
        runner._shutdown_timeout = _AT_ONCE_SECONDS  # aiohttp reads its shutdown timeout from the runner
        await runner.cleanup()

    async def _suspend(self) -> None:
        """Stops listening and drops every connection, keeping the port's number (tests use it
        to make Toolport see connection failures at this origin)."""
        assert self._runner is not None and self._site is not None
        await self._site.stop()
        self._site = None
        server = self._runner.server
        if server is not None:
            for conn in list(server.connections):
                conn.force_close()
                if conn.transport is not None:
                    conn.transport.close()

    async def _resume(self) -> None:
        await self._bind(self._bound_port)

    def _refusal(self, request: web.Request, path: str) -> tuple[int, str] | None:
        if not is_loopback_host_header(request.headers.get("host")):
            return 403, "the Host header must name a loopback address"
        if "origin" in request.headers:
            return 403, "browser requests are not accepted"
        if not path.startswith(self._prefix):
            return 404, "not found"
        if request.method != "POST":
            return 405, "only POST"
        if request.content_type != "application/json":
            return 415, "the body must be application/json"
        # Never decoded (auto_decompress off): inflating a body costs the event loop, and Toolport
        # never compresses one.
        codings = ",".join(request.headers.getall("content-encoding", [])).lower().split(",")
        if any(coding.strip() not in ("", "identity") for coding in codings):
            return 415, "the body must not be compressed"
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        task = asyncio.current_task()  # this request's own task (aiohttp runs each in one)
        if task is not None:
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)
        path = _raw_path(request)
        refusal = self._refusal(request, path)
        if refusal is not None:
            return web.Response(status=refusal[0], text=refusal[1])
        name = _name_of(path[len(self._prefix):])
        tool = None if name is None else self._tools.get(name)
        if tool is None:
            return web.Response(status=404, text="no such tool")
        try:
            body = decode(await request.read())  # strict UTF-8
        except web.HTTPRequestEntityTooLarge:
            return web.Response(status=413, text=f"the body is larger than {self._max_body_bytes} bytes",
                                headers={"connection": "close"})
        except UnicodeDecodeError:
            return web.Response(status=400, text="the body is not valid UTF-8")
        except ValueError:
            return web.Response(status=400, text="the body is not valid JSON")
        if not isinstance(body, dict):
            return web.Response(status=400, text="the body must be a JSON object")
        return _reply(await self._call(tool, body, request))

    async def _call(self, tool: Tool, body: dict[str, Any], request: web.Request) -> bytes:
        call_id = body.get("call_id")
        if not isinstance(call_id, str):
            call_id = request.headers.get("x-toolport-call-id", "")
        ctx = CallContext(tool.name, call_id, _deadline_ms(request.headers.get("x-toolport-deadline-ms"), tool.timeout_seconds))

        args = body.get("arguments")
        if args is None and isinstance(body.get("raw_arguments"), str):
            try:
                args = decode(body["raw_arguments"] or "{}")
            except ValueError:
                return error_reply("invalid arguments: not valid JSON")
        try:
            kwargs = tool.signature.arguments({} if args is None else args)
        except ArgumentsError as err:
            return error_reply(f"invalid arguments: {err}")

        assert self._executor is not None  # listen() made it; no request arrives before
        task = tool.invoke(kwargs, ctx, self._executor)
        try:
            done, _ = await asyncio.wait({task}, timeout=ctx.deadline_ms / 1000)
        except asyncio.CancelledError:
            # aiohttp cancels this handler when Toolport closes the connection: the call was
            # cancelled, or Toolport's own deadline ran out, which it counts from a little before
            # the call arrived here: a hang-up that close to the deadline is the deadline, whichever
            # clock ran out first. Nobody awaits the answer.
            slack = min(_DEADLINE_SLACK, ctx.deadline_ms / 4000)
            ctx._cancel("deadline" if ctx.remaining() <= slack else "disconnected")
            task.cancel()
            task.add_done_callback(_consume)
            raise
        if not done:
            ctx._cancel("deadline")
            task.cancel()
            task.add_done_callback(_consume)
            return error_reply(f"the call's deadline of {ctx.deadline_ms} ms passed")
        try:
            result = task.result()
        except asyncio.CancelledError:
            return error_reply("the tool was cancelled")
        except Exception as caught:  # the tool's failure is the model's business, as a tool error
            raised: BaseException = caught.raised if isinstance(caught, ToolRaised) else caught
            # Its type and frames, not its message: that may quote the call's arguments.
            self._log.debug("tool %r (call %r) raised %s\n%s", tool.name, ctx.call_id, type(raised).__name__, _frames(raised))
            return exception_reply(raised)
        return output_reply(result)


class _RequestHandler(RequestHandler):
    """aiohttp's connection handler, but for requests it cannot parse: a fixed answer that quotes
    nothing of the request, and nothing of it logged. It parses one request at a time (aiohttp's
    own flow control with a queue of one), so a request that fails to parse does not discard a
    complete call read before it (aiohttp drops every request of a read that ends in a parse error):
    the call is answered first, then the 400, and the connection closes."""

    def __init__(self, manager: web.Server, *, loop: asyncio.AbstractEventLoop, **kwargs: Any) -> None:
        super().__init__(manager, loop=loop, **kwargs)
        if hasattr(self, "_max_msg_queue_size"):  # aiohttp >= 3.14; older ones parse a whole read
            self._max_msg_queue_size = 1
            self._msg_queue_resume_size = 0
            self._parser = HttpRequestParser(
                self, loop, kwargs.get("read_bufsize", DEFAULT_CHUNK_SIZE), max_line_size=self.max_line_size,
                max_field_size=self.max_field_size, max_headers=self.max_headers,
                payload_exception=RequestPayloadError,
                auto_decompress=kwargs.get("auto_decompress", True), max_msg_queue_size=1,
            )

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._first_request_timer: asyncio.TimerHandle | None = self._loop.call_later(
            _FIRST_REQUEST_SECONDS, self._close_without_request)

    def _close_without_request(self) -> None:
        self._first_request_timer = None
        if self._request_count == 0 and self.transport is not None:
            self.logger.debug("closed a connection that sent no request within %s s", _FIRST_REQUEST_SECONDS)
            self.transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._first_request_timer is not None:
            self._first_request_timer.cancel()
            self._first_request_timer = None
        super().connection_lost(exc)

    def handle_error(self, request: BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        # aiohttp's message quotes the request's bytes: only the exception's type is logged.
        if status >= 500 and exc is not None:
            # An exception escaping the SDK's own handler reaches here, not log_exception.
            self.log_exception(exc_info=exc)
        else:
            self.logger.debug("refused a request with %d (%s)", status, type(exc).__name__ if exc else "no details")
        if request.writer.output_size > 0:
            raise ConnectionError("an answer was sent already")
        try:
            text = HTTPStatus(status).phrase
        except ValueError:
            text = "error"
        response = web.Response(status=status, text=text)
        response.force_close()
        return response

    def log_exception(self, *args: Any, **kw: Any) -> None:
        # An exception escaping the SDK's own handler (a bug in the SDK, not the tool's): its type at
        # ERROR, its frames at DEBUG (not its message, which may hold call data), as for a tool's
        # exception.
        exc_info = kw.get("exc_info")
        err = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        kind = type(err).__name__ if err is not None else "no details"
        self.logger.error("internal error in the plugin SDK (%s)", kind)
        if err is not None:
            self.logger.debug("the internal error's traceback (%s):\n%s", kind, _frames(err))


class _Server(web.Server):
    def __call__(self) -> RequestHandler:
        return _RequestHandler(self, loop=self._loop, **self._kwargs)


class _AppRunner(web.AppRunner):
    """``web.AppRunner`` serving with ``_RequestHandler`` (aiohttp has no option naming the
    connection handler's class): the server it makes, rebuilt as a ``_Server``."""

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()
        return _Server(made.request_handler, request_factory=made.request_factory,
                       handler_cancellation=made.handler_cancellation, loop=asyncio.get_running_loop(), **made._kwargs)


def _raw_path(request: web.Request) -> str:
    """The request's path as sent, still percent-encoded: aiohttp's ``request.path`` is decoded
    already, and decoding it again would turn a name's own ``%41`` into ``A``."""
    return request.raw_path.partition("?")[0]


def _consume(task: asyncio.Future[Any]) -> None:
    """Retrieves an abandoned task's outcome so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


def _reply(body: bytes) -> web.Response:
    return web.Response(body=body, content_type="application/json", charset="utf-8",
                        headers={"cache-control": "no-store"})


_MAX_DEADLINE_DIGITS = 10  # 2**31 - 1 ms: the longest timer, as the TypeScript SDK caps it


def _deadline_ms(header: str | None, timeout_seconds: float) -> int:
    """Toolport's header when it is a positive integer, else the tool's own timeout."""
    if header is not None and header.isascii() and header.isdigit() and len(header) <= _MAX_DEADLINE_DIGITS and int(header) > 0:
        return min(int(header), 2**31 - 1)
    return round(timeout_seconds * 1000)


def _frames(err: BaseException) -> str:
    """The traceback's frames (files, lines, code), without the exception's message."""
    return "".join(traceback.format_tb(err.__traceback__))
