"""A plugin's life: serve callbacks, register, keep the registrations alive, clear them on stop.

Registrations are runtime-only (docs/protocol.md R3), and a plugin's tools also vanish when
Toolport evicts its origin (R13) or someone unregisters them (R15). So, once started, the plugin
watches Toolport:

- **Event stream** (when Toolport serves ``GET /api/events``): each connection starts with a
  ``hello`` naming the Toolport instance; every (re)connection runs one check, so a restart (a new
  ``instance_id``) or anything missed while disconnected is repaired at once. ``evicted`` events
  for this plugin's origin or tools, ``unregistered``, ``cleared`` and ``role-added`` run a check
  too, and a slow periodic check (``resync_interval``) guards against anything missed.
- **Polling** (a Toolport without the stream): a check every ``poll_interval`` (±20 % jitter so
  plugins restarted together do not poll in step).

A *check* lists the tools (``GET /api/tools``) and registers whatever of this plugin's tools a role
lacks. While Toolport is down, checks and reconnections back off exponentially with jitter, up to
``max_backoff``. Only one exchange with Toolport that registers runs at a time (``_lock``), and
``stop()`` waits for it before clearing, so a registration never lands after the clear.
"""
from __future__ import annotations

import asyncio
import secrets
import inspect
import logging
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, overload
from urllib.parse import urlsplit

from . import errors
from ._client import NoEventStream, ToolportClient, problems_text, proves_not_registered
from ._options import check_options
from ._schema import JsonSchema, SchemaError, Signature
from ._server import CallbackServer
from ._tool import CallContext, Tool
from .errors import PluginError, is_transient

F = TypeVar("F", bound=Callable[..., Any])

# `hello` opens every stream whatever the filter, so it is not asked for.
_EVENT_TYPES = ["evicted", "unregistered", "cleared", "role-added"]
_MAX_NAME_CHARS = 64
# After a stream that was up (its hello came) ends: reconnect after 0.25–0.5 s. While attempts get
# no stream: 0.5–1 s, then doubling up to max_backoff (as the TypeScript SDK does).
_RECONNECT_BASE_SECONDS = 0.5


@dataclass(frozen=True)
class RegisteredEvent:
    """Passed to ``on("registered", …)`` listeners."""

    names: list[str]
    roles: list[str]
    #: ``"start"`` or ``"restored"`` (a check found them missing and registered them again).
    reason: str


@dataclass(frozen=True)
class StartResult:
    #: Base URL of the callback server, e.g. ``http://127.0.0.1:41234``.
    url: str
    names: list[str]
    roles: list[str]


@dataclass(frozen=True)
class StopResult:
    #: True when Toolport confirmed the clear (R16).
    is_cleared: bool
    #: How many registrations the clear removed.
    removed: int
    #: Why the clear failed (Toolport down, …), or None.
    error: PluginError | None = None


@dataclass
class _Watch:
    """The watcher's state (only touched from the event loop)."""

    failures: int = 0
    #: Follow the event stream: the ``use_events`` option, but off while Toolport serves none.
    use_events: bool = True
    instance_id: str | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    follower: asyncio.Task[None] | None = None
    #: True while the event stream is open.
    streaming: bool = False
    #: Set when the stream ends: the check loop times its wait again (no check).
    retime: asyncio.Event = field(default_factory=asyncio.Event)


class Plugin:
    """A Toolport plugin: declare tools with ``@plugin.tool``, then ``run()`` it.

    Example::

        plugin = Plugin("weather")          # source "plugin:weather"

        @plugin.tool(description="Get the weather for a city.")
        async def get_weather(city: str, unit: Literal["c", "f"] = "c") -> dict:
            return {"city": city, "temperature": 28}

        plugin.run()                        # until SIGINT/SIGTERM; then clears its tools
    """

    def __init__(
        self,
        id: str,  # noqa: A002 - the plugin's id is what users call it
        *,
        toolport_url: str | None = None,
        role: str | None = None,
        token: str | None = None,
        token_file: str | None = None,
        plugin_key: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        poll_interval: float = 2.0,
        resync_interval: float = 30.0,
        max_backoff: float = 30.0,
        request_timeout: float = 10.0,
        start_timeout: float = 30.0,
        use_events: bool = True,
        max_body_bytes: int = 8 * 1024 * 1024,
        logger: logging.Logger | None = None,
    ) -> None:
        source, url, token, host = check_options(
            id, toolport_url=toolport_url, role=role, token=token, token_file=token_file, plugin_key=plugin_key,
            host=host, port=port,
            seconds={"poll_interval": poll_interval, "resync_interval": resync_interval,
                     "max_backoff": max_backoff, "request_timeout": request_timeout},
            start_timeout=start_timeout, use_events=use_events, max_body_bytes=max_body_bytes,
        )

        self.source = source
        self.role = role
        self._poll_interval = float(poll_interval)
        self._resync_interval = float(resync_interval)
        self._max_backoff = float(max_backoff)
        self._start_timeout = float(start_timeout)
        self._log = logger or logging.getLogger("toolport_plugin")
        self._tools: dict[str, Tool] = {}
        # Random per plugin: in ownership mode the source is ours while our tools are registered.
        self.plugin_key = secrets.token_urlsafe(32) if plugin_key is None else plugin_key
        self._client = ToolportClient(url, token, float(request_timeout), self.plugin_key)
        self._server = CallbackServer(host, port, max_body_bytes, self._tools, self._log)
        self._listeners: dict[str, list[Callable[[Any], Any]]] = {"registered": [], "error": []}
        self._state = "idle"  # idle → starting → running → stopping → stopped
        self._lock = asyncio.Lock()
        self._has_registered = False
        # Takeovers warned about once each: those the last check's listing showed.
        self._conflicts: set[tuple[str, str, str, str]] = set()
        # The option, kept apart from _Watch.use_events, which also turns off while Toolport
        # serves no event stream and on again when a check succeeds after an outage.
        self._use_events = use_events
        self._watch = _Watch(use_events=self._use_events)
        self._stopping: asyncio.Future[StopResult] | None = None
        # The event loop start() ran on: a stop() from another thread's loop is handed to it.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested = asyncio.Event()
        self._listener_tasks: set[asyncio.Future[Any]] = set()

    # ---- declaring tools -------------------------------------------------------------------

    @overload
    def tool(self, fn: F, *, name: str | None = None, description: str | None = None,
             parameters: JsonSchema | None = None, timeout_seconds: float = 30) -> F: ...

    @overload
    def tool(self, fn: None = None, *, name: str | None = None, description: str | None = None,
             parameters: JsonSchema | None = None, timeout_seconds: float = 30) -> Callable[[F], F]: ...

    def tool(
        self,
        fn: F | None = None,
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: JsonSchema | None = None,
        timeout_seconds: float = 30,
    ) -> F | Callable[[F], F]:
        """Declares a tool; use as ``@plugin.tool`` or ``@plugin.tool(description=..., ...)``.

        The parameters' JSON Schema comes from the type hints (``int``, ``float``, ``bool``,
        ``str``, ``Literal``, ``list[...]``, ``dict[str, ...]``, ``Optional``, ``Enum``,
        ``TypedDict``, dataclasses, pydantic models), or is given as ``parameters`` (then the
        arguments arrive as keyword arguments as they are). A parameter annotated ``CallContext``
        receives the call's context. ``description`` defaults to the docstring.

        ``fn`` may also be a callable object (typed by its ``__call__``) or a ``functools.partial``
        (the keywords it fixes are not parameters); neither has a name of its own: give ``name``.
        """
        def decorate(f: F) -> F:
            self._add_tool(f, name, description, parameters, timeout_seconds)
            return f
        return decorate(fn) if fn is not None else decorate

    def _add_tool(self, fn: Callable[..., Any], name: str | None, description: str | None,
                  parameters: JsonSchema | None, timeout_seconds: float) -> None:
        if self._state != "idle":
            raise PluginError(errors.STATE, "tools must be declared before start()")
        # An empty name is refused below, never replaced by the function's name.
        tool_name = getattr(fn, "__name__", "") if name is None else name
        if not isinstance(tool_name, str) or not 1 <= len(tool_name) <= _MAX_NAME_CHARS:
            raise PluginError(errors.OPTIONS, f"a tool name must be 1–{_MAX_NAME_CHARS} characters (got {tool_name!r})")
        if not _is_unicode_text(tool_name):  # its callback URL is its UTF-8, percent-encoded
            raise PluginError(errors.OPTIONS, f"a tool name must be Unicode text, without lone surrogates (got {tool_name!r})")
        if tool_name in self._tools:
            raise PluginError(errors.OPTIONS, f"the tool {tool_name!r} is declared twice")
        if description is not None and not isinstance(description, str):
            raise PluginError(errors.OPTIONS, f"the description of {tool_name!r} must be a string (got {type(description).__name__})")
        if isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, (int, float)) or not 0 < timeout_seconds <= 300:
            raise PluginError(errors.OPTIONS, f"timeout_seconds of {tool_name!r} must be > 0 and ≤ 300")
        try:
            signature = Signature(fn, tool_name, parameters, CallContext)
        except SchemaError as err:
            raise PluginError(errors.OPTIONS, str(err)) from err
        text = description if description is not None else (inspect.getdoc(fn) or "")
        self._tools[tool_name] = Tool(tool_name, text, fn, signature, float(timeout_seconds))

    @property
    def tools(self) -> dict[str, Tool]:
        """The declared tools, by name (``tool.parameters`` is the registered JSON Schema)."""
        return dict(self._tools)

    # ---- events ----------------------------------------------------------------------------

    @overload
    def on(self, event: Literal["registered"], listener: Callable[[RegisteredEvent], Any]) -> None: ...

    @overload
    def on(self, event: Literal["error"], listener: Callable[[PluginError], Any]) -> None: ...

    def on(self, event: str, listener: Callable[[Any], Any]) -> None:
        """Listens to ``"registered"`` (a ``RegisteredEvent``) or ``"error"`` (a ``PluginError``
        from the background: a failed check, re-registration or clear; retried by itself).
        A listener may be a plain or an ``async`` function."""
        if event not in self._listeners:
            raise ValueError(f"unknown event {event!r} (known: registered, error)")
        self._listeners[event].append(listener)

    def _emit(self, event: str, payload: Any) -> None:
        for listener in list(self._listeners[event]):
            try:
                result = listener(payload)
                if inspect.isawaitable(result):
                    task = asyncio.ensure_future(result)
                    self._listener_tasks.add(task)  # held until done: the loop keeps only weak references
                    task.add_done_callback(self._listener_done)
            except Exception:  # a listener's bug must not stop the plugin
                self._log.exception("a %r listener raised", event)

    def _listener_done(self, task: asyncio.Future[Any]) -> None:
        self._listener_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._log.error("an async listener raised", exc_info=task.exception())

    def _report(self, err: PluginError, level: int) -> None:
        if self._listeners["error"]:
            self._emit("error", err)
        else:
            self._log.log(level, "%s", err)

    # ---- life ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Base URL of the callback server (``""`` before ``start()``)."""
        return self._server.origin

    @property
    def is_running(self) -> bool:
        return self._state == "running"

    @property
    def watch_mode(self) -> str:
        """How the plugin watches Toolport now: ``"events"`` while it follows the event stream,
        else ``"polling"``."""
        return "events" if self._watch.streaming else "polling"

    def callback_url(self, name: str) -> str:
        """The callback URL a tool is registered with (``""`` before ``start()``)."""
        return self._server.callback_url(name) if self._server.origin else ""

    async def start(self) -> StartResult:
        """Serves the callbacks and registers every tool; returns once all are registered.

        While Toolport is unreachable or busy it retries for ``start_timeout`` seconds (so a
        plugin may start before Toolport); an answer saying the registration is wrong (4xx)
        raises at once. On failure whatever was registered is cleared and the server closed
        (also a registration Toolport may have taken without its answer arriving).
        """
        if self._state != "idle":
            raise PluginError(errors.STATE, f"start() needs a new Plugin (this one is {self._state})")
        if not self._tools:
            raise PluginError(errors.OPTIONS, "declare at least one tool with @plugin.tool before start()")
        self._state = "starting"
        self._loop = asyncio.get_running_loop()
        try:
            url = await self._server.listen()
            names, roles = await self._register_at_start()
            if self._state != "starting":
                raise _stopped_during_start()
        except BaseException:
            if self._state == "starting":
                await self.stop(grace=0)
            raise
        self._state = "running"
        self._watch.tasks.append(asyncio.create_task(self._check_loop(), name="toolport-plugin-checks"))
        if self._watch.use_events:
            self._start_follower()
        self._log.info("registered %d tool(s) of %s (roles: %s); callbacks at %s",
                       len(names), self.source, ", ".join(roles) or "none", url)
        self._emit("registered", RegisteredEvent(names, roles, "start"))
        return StartResult(url, names, roles)

    async def stop(self, grace: float = 5.0) -> StopResult:
        """Stops watching, clears the source (R16) so no new call arrives, then closes the server,
        letting calls in flight finish for ``grace`` seconds. Never raises: a failed clear is in
        the result (and an ``error`` event).

        From another thread (the plugin runs ``run()`` there), ``asyncio.run(plugin.stop())`` hands
        the stop to the plugin's own event loop and waits for it. Once the loop ``start()`` ran on
        has ended without a stop (``asyncio.run(plugin.start())``, later
        ``asyncio.run(plugin.stop())``), the server went with it and ``stop()`` clears the tools.
        """
        loop = self._loop
        if loop is not None and loop is not asyncio.get_running_loop():
            stopping = self._stopping
            if loop.is_closed():
                if stopping is not None and stopping.done() and not stopping.cancelled():
                    return stopping.result()
                # This loop runs the stop from now on (a later stop() here awaits the same one).
                self._loop = asyncio.get_running_loop()
                self._stopping = asyncio.ensure_future(self._stop_after_loop_ended())
                return await asyncio.shield(self._stopping)
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.stop(grace), loop))
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop(grace))
        return await asyncio.shield(self._stopping)

    async def _stop(self, grace: float) -> StopResult:
        self._state = "stopping"
        self._stop_requested.set()
        # Wait for the one registering exchange in flight, then end the watchers, so no
        # registration can land after the clear below.
        async with self._lock:
            tasks = [*self._watch.tasks, *([self._watch.follower] if self._watch.follower else [])]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            result = await self._clear(self._client)
        await self._server.close(grace)
        await self._client.close()
        self._state = "stopped"
        return result

    async def _clear(self, client: ToolportClient) -> StopResult:
        """Clears the source with ``client`` (R16), as stop() reports it."""
        # Nothing of ours can be registered if no registration was ever sent (or each was
        # refused); another instance's tools under the same source are then none of our business.
        if not self._has_registered:
            return StopResult(False, 0, None)
        try:
            removed = await client.clear(self.source, self.role)
            return StopResult(True, removed, None)
        except PluginError as err:
            if self.role is not None and _is_role_not_found(err):
                # The plugin's one role is gone, and every tool of ours went with it.
                return StopResult(True, 0, None)
            self._report(err, logging.WARNING)
            return StopResult(False, 0, err)

    async def _stop_after_loop_ended(self) -> StopResult:
        """stop() once the event loop start() ran on is gone without one (``asyncio.run(start())``,
        then ``asyncio.run(stop())``): the server went with that loop, and its tools are still
        registered. They are cleared with a client of this loop."""
        self._state = "stopped"
        self._stop_requested.set()
        client = self._client.fresh()
        try:
            return await self._clear(client)
        finally:
            await client.close()

    async def __aenter__(self) -> Plugin:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def run(self) -> None:
        """Starts the plugin and serves until SIGINT or SIGTERM, then stops it (clearing its
        tools). Blocks; runs its own event loop. Raises what ``start()`` raises.

        It also returns once the plugin is stopped otherwise (a tool or a listener calls
        ``stop()``), and a signal during ``start()`` (still retrying while Toolport is down) ends
        it as quietly as one after. Inside a running event loop it raises ``PluginError``
        ``TP_ERR_PLUGIN_STATE``: use ``async with plugin`` or ``await plugin.start()`` there.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass  # no loop in this thread: run() makes its own
        else:
            # Checked before the coroutine exists: asyncio.run() would refuse it with a bare
            # RuntimeError, and the coroutine would be reported as never awaited.
            raise PluginError(errors.STATE, "run() runs its own event loop, and this thread runs one already: "
                                            "use `async with plugin` or `await plugin.start()` … `await plugin.stop()`")
        asyncio.run(self._run_until_signal())

    async def _run_until_signal(self) -> None:
        loop = asyncio.get_running_loop()
        stopping: list[asyncio.Future[StopResult]] = []  # held: the loop keeps only weak references

        def on_signal() -> None:
            # stop() also ends a start() still retrying (start() then raises STATE), so a signal
            # there does not wait for start_timeout, nor register with a Toolport that came up.
            stopping.append(asyncio.ensure_future(self.stop()))

        installed: list[signal.Signals] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, on_signal)
                installed.append(sig)
            except (NotImplementedError, RuntimeError):  # Windows, or not the main thread
                pass  # then run() ends when something calls stop() (or on KeyboardInterrupt)
        try:
            try:
                await self.start()
            except PluginError as err:
                if err.code == errors.STATE and self._stop_requested.is_set():
                    await self.stop()  # a signal (or a stop()) during start(): a clean stop
                    return
                raise
            try:
                # Whoever calls stop() — a signal handler above, a tool, a listener — ends run().
                await self._stop_requested.wait()
            finally:
                await self.stop()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    # ---- registering -----------------------------------------------------------------------

    def _registration(self, tool: Tool, role: str | None) -> dict[str, Any]:
        """The wire form of one registration: the one place it is built."""
        return {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
            "callback_url": self._server.callback_url(tool.name),
            "role": role,
            "source": self.source,
            "timeout_seconds": tool.timeout_seconds,
        }

    async def _register(self, tools: list[Tool], role: str | None) -> tuple[list[str], list[str]]:
        """Registers ``tools`` with ``role``, one request each (Toolport syncs every role's
        sessions before it answers, so a burst would gain nothing). Caller holds ``_lock``."""
        names: list[str] = []
        roles: list[str] = []
        for tool in tools:
            if self._state in ("stopping", "stopped"):
                break
            # Set before the request: Toolport may take the registration and its answer never
            # arrive (start() cancelled, its request timed out), and stop()'s clear must not be
            # skipped then. Only a refusal, or a connection that could not be made, proves this
            # one was not registered (an `ok: false` answer may come with the registry holding
            # it, when its roles' syncs failed: R8).
            had_registered, self._has_registered = self._has_registered, True
            try:
                answer = await self._client.register(self._registration(tool, role))
            except PluginError as err:
                if proves_not_registered(err):
                    self._has_registered = had_registered
                raise
            names.append(tool.name)
            # The answer's fields are read defensively: a field of another type is treated as absent.
            affected = answer.get("affected_roles")
            roles.extend(r for r in (affected if isinstance(affected, list) else []) if isinstance(r, str) and r not in roles)
            refused, unsynced = answer["refused"], answer["unsynced"]
            if refused:
                # R5/R8: those roles keep the local tool or the other source's tool.
                self._log.warning("%r registered, but %d role(s) refused it: the name is taken%s",
                                  tool.name, len(refused), problems_text(refused))
            if unsynced:
                # R8: the registry has it; the role's next successful sync carries it to the model.
                self._log.warning("%r registered, but %d role(s) failed to sync it to their sessions%s",
                                  tool.name, len(unsynced), problems_text(unsynced))
        return names, roles

    async def _register_at_start(self) -> tuple[list[str], list[str]]:
        give_up_at = time.monotonic() + self._start_timeout
        attempt = 0
        while True:
            attempt += 1
            try:
                async with self._lock:
                    return await self._register(list(self._tools.values()), self.role)
            except PluginError as err:
                if self._state != "starting":
                    raise _stopped_during_start() from err
                if not is_transient(err) or self._start_timeout == 0:
                    raise
                left = give_up_at - time.monotonic()
                if left <= 0:
                    raise PluginError(errors.START_TIMEOUT,
                                      f"could not register with Toolport within {self._start_timeout:g} s: {err.message}") from err
                self._log.debug("start: attempt %d failed, retrying: %s", attempt, err.message)
                if await self._sleep(min(left, self._backoff(attempt))):
                    raise _stopped_during_start() from err

    # ---- watching --------------------------------------------------------------------------

    async def _sleep(self, seconds: float) -> bool:
        """Sleeps; True when stop() came first."""
        try:
            await asyncio.wait_for(self._stop_requested.wait(), timeout=seconds)
        except asyncio.TimeoutError:
            return False
        return True

    def _backoff(self, failures: int, base: float | None = None) -> float:
        """Exponential backoff with equal jitter: ceiling/2 + random(ceiling/2)."""
        base = self._poll_interval if base is None else base
        ceiling = min(self._max_backoff, base * 2 ** min(max(failures - 1, 0), 30))
        delay: float = ceiling / 2 + random.random() * ceiling / 2
        return delay

    def _start_follower(self) -> None:
        if self._watch.follower is None or self._watch.follower.done():
            self._watch.follower = asyncio.create_task(self._follow_events(), name="toolport-plugin-events")

    async def _follow_events(self) -> None:
        """Follows ``GET /api/events`` while Toolport serves it; returns when it does not."""
        failures = 0  # attempts in a row that got no stream
        types: list[str] | None = _EVENT_TYPES
        while self._state == "running":
            was_up = False
            try:
                async with self._client.events(types) as stream:
                    self._watch.streaming = True
                    # Every (re)connection: repair whatever happened while not following (a
                    # restart empties the registry; the hello below names the new instance).
                    self._watch.wake.set()
                    try:
                        async for event, data in stream:
                            if event == "hello" and isinstance(data.get("instance_id"), str):
                                # Only a `hello` naming the instance shows the stream is really up
                                # (README "Python plugin SDK" → Keeping registrations alive): any
                                # other event, or none, before the stream ends leaves the
                                # reconnection backoff growing.
                                was_up = True
                            try:
                                self._on_event(event, data)
                            except Exception as err:  # noqa: BLE001 - one odd event must not end the watch
                                self._report(PluginError(errors.REFUSED, f"Toolport sent an event {event!r} this plugin cannot read: "
                                                                         f"{type(err).__name__}: {err}"), logging.WARNING)
                    finally:
                        self._watch.streaming = False
                        # The check loop waits resync_interval while the stream is up: without
                        # it, poll_interval (README "Python plugin SDK" → Keeping registrations
                        # alive). It times its wait again, without a check.
                        self._watch.retime.set()
            except NoEventStream as err:
                if err.status in (400, 422) and types is not None:
                    types = None  # a filter this Toolport does not take: follow every event instead
                    continue
                self._log.debug("Toolport's event stream is not usable (%s); checking every %g s instead", err, self._poll_interval)
                self._watch.use_events = False
                self._watch.wake.set()  # the check loop switches to the poll interval now
                return
            except PluginError as err:
                self._log.debug("event stream: %s", err.message)
            except Exception as err:  # noqa: BLE001 - the follower goes on; polling covers what it misses
                self._report(PluginError(errors.REFUSED, f"the event stream failed: {type(err).__name__}: {err}"), logging.WARNING)
            # The stream ended: Toolport stopped or restarted. Reconnect at once (a restarted
            # Toolport is back within a second or so), backing off while it stays down.
            failures = 0 if was_up else failures + 1
            await asyncio.sleep(self._backoff(failures + 1, _RECONNECT_BASE_SECONDS))

    def _on_event(self, event: str, data: dict[str, Any]) -> None:
        if event == "hello":
            instance = data.get("instance_id")
            previous = self._watch.instance_id
            if isinstance(instance, str):
                if previous is not None and instance != previous:
                    self._log.info("Toolport restarted (instance %s → %s); registering again", previous, instance)
                self._watch.instance_id = instance
        elif event == "evicted":
            listed = data.get("tools")
            tools: list[Any] = listed if isinstance(listed, list) else []
            ours = any(isinstance(t, dict) and isinstance(t.get("name"), str) and t["name"] in self._tools for t in tools)
            if data.get("origin") == self._server.origin or ours:
                self._log.info("Toolport evicted this plugin's origin %s; registering again", data.get("origin"))
                self._watch.wake.set()
        elif event in ("unregistered", "cleared"):
            # Only a removal of its origin's or source's tools, or of a name it declares (another
            # source that held it stopped: the name is free for this plugin again), concerns it;
            # without the `types` filter every event comes here, `call` events by the hundred.
            listed = data.get("tools")
            tools = listed if isinstance(listed, list) else []
            named = any(isinstance(t, dict) and isinstance(t.get("name"), str) and t["name"] in self._tools for t in tools)
            if named or data.get("origin") == self._server.origin or data.get("source") == self.source:
                self._watch.wake.set()
        elif event == "role-added" and (self.role is None or data.get("role") == self.role):
            # A role that lacks its tools: a new one (for a plugin of every role), or its own
            # role added back. Other roles are none of a one-role plugin's business.
            self._watch.wake.set()

    async def _check_loop(self) -> None:
        watch = self._watch
        while self._state == "running":
            if watch.failures > 0:
                delay = self._backoff(watch.failures)
            elif watch.use_events and watch.streaming:
                delay = self._resync_interval
            else:
                delay = self._poll_interval * (0.8 + 0.4 * random.random())
            waits = {asyncio.ensure_future(watch.wake.wait()), asyncio.ensure_future(watch.retime.wait())}
            try:
                await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()
            if watch.retime.is_set() and not watch.wake.is_set():
                watch.retime.clear()
                continue  # the stream went: wait again, for poll_interval
            watch.retime.clear()
            watch.wake.clear()
            if self._state != "running":
                return
            try:
                async with self._lock:
                    if self._state != "running":
                        return
                    await self._check()
            except Exception as err:  # noqa: BLE001 - a check that fails, however, is retried with backoff
                if not isinstance(err, PluginError):
                    err = PluginError(errors.REFUSED, f"Toolport's answer to a check could not be read: {type(err).__name__}: {err}")
                watch.failures += 1
                self._report(err, logging.WARNING if watch.failures == 1 else logging.DEBUG)
                continue
            if watch.failures > 0:
                self._log.info("Toolport answers again after %d failed check(s)", watch.failures)
                watch.failures = 0
                # A Toolport that came back may be a newer one, with the event stream.
                if self._use_events and not watch.use_events:
                    watch.use_events = True
                    self._start_follower()

    async def _check(self) -> None:
        """One check: list the tools, register again whatever of ours a role lacks. A name held
        by another source or at another URL is left alone (warned about once): re-registering
        would start a tug of war with whoever replaced it (R5 lets anyone replace a name)."""
        # Only our names: the answer holds our rows (or whoever took a name over), never other plugins'.
        listed = await self._client.list(self.role, self._tools.keys())
        missing: dict[str, list[str]] = {}
        seen: set[tuple[str, str, str, str]] = set()
        for role_name, rows in listed.items():
            by_name = {row["name"]: row for row in rows if isinstance(row.get("name"), str)}
            for tool in self._tools.values():
                row = by_name.get(tool.name)
                if row is None:
                    missing.setdefault(tool.name, []).append(role_name)
                else:
                    self._note_conflict(role_name, tool, row, seen)
        # Only the takeovers this listing still shows are remembered: with roles made and removed
        # per conversation, one kept for every role that ever had one would grow without bound.
        self._conflicts &= seen
        if not missing:
            return
        names: list[str] = []
        roles: list[str] = []
        try:
            for tool_name, missing_roles in missing.items():
                # With a fixed role, or missing everywhere (a restart): one registration as at
                # start. Otherwise only the roles that lack it, so a role where another source
                # holds the name keeps it; with role=None this also reaches roles created later.
                everywhere = self.role is not None or len(missing_roles) == len(listed)
                for target in ([self.role] if everywhere else missing_roles):
                    try:
                        done_names, done_roles = await self._register([self._tools[tool_name]], target)
                    except PluginError as err:
                        # A role removed since the list took its tools with it: nothing to restore
                        # there, and the other roles still need theirs.
                        if self.role is None and target is not None and _is_role_not_found(err):
                            continue
                        raise
                    roles.extend(r for r in done_roles if r not in roles)
                    if done_names and tool_name not in names:
                        names.append(tool_name)
        finally:
            if names:
                self._log.info("registered again (they were missing): %s", ", ".join(names))
                self._emit("registered", RegisteredEvent(names, roles, "restored"))

    def _note_conflict(self, role: str, tool: Tool, row: dict[str, Any], seen: set[tuple[str, str, str, str]]) -> None:
        source, url = str(row.get("source", "")), str(row.get("callback_url", ""))
        if source == self.source and url == self._server.callback_url(tool.name):
            return
        key = (role, tool.name, source, url)
        seen.add(key)
        if key in self._conflicts:
            return
        self._conflicts.add(key)
        # Another instance's callback is named by its origin: its path holds that instance's
        # random segment, the defence of its calls (README "Python plugin SDK" → Privacy).
        owner = f"another callback ({_origin_of(url) if url else 'a local tool'})" if source == self.source else f"source {source or 'local'!r}"
        self._log.warning("%r in role %r now belongs to %s; leaving it alone", tool.name, role, owner)


def _is_unicode_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _origin_of(url: str) -> str:
    """``scheme://host:port`` of a callback URL, never its path (which carries a secret segment)."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return "an unreadable URL"
    if not parts.scheme or not host:
        return "an unreadable URL"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}" + ("" if port is None else f":{port}")


def _stopped_during_start() -> PluginError:
    return PluginError(errors.STATE, "stop() was called before start() finished")


def _is_role_not_found(err: PluginError) -> bool:
    """Toolport's 404 for a role that does not exist (any more)."""
    return err.toolport_code == "TP_ERR_ROLE_NOT_FOUND"
