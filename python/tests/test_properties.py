"""Property-based tests of the plugin SDK against a real Toolport, over real loopback sockets.

A Hypothesis state machine (``PluginMachine``) drives one plugin at a time through random
sequences of what happens to a plugin in the wild, and checks after every step what the docs
promise (python/README.md, README.md "Python plugin SDK", docs/protocol.md):

- steps: a plugin starts (1-4 tools of random names and kinds: sync/async echo, typed arguments
  with a pydantic model and a dataclass, ToolError, a plain exception, slow sync/async handlers
  with a short or long ``timeout_seconds``; role ``None``, a named role or an unknown one; the event
  stream or polling; 127.0.0.1 or ::1; the previous port again), stops (grace periods, with a call
  in flight, with Toolport down), is started while Toolport is down or with a tool Toolport
  refuses; Toolport is killed, started again, or restarted on the same port with another set of
  roles; someone unregisters or clears the plugin's tools, or another source takes a name over in
  one role and later gives it back; the plugin's origin is evicted; calls arrive through
  ``POST /api/tools/call`` (ok, invalid arguments, raised ``ToolError``/exception, concurrent,
  past the deadline, aborted by the caller).
- invariants: once a step settles, ``GET /api/tools`` lists exactly what the plugin declares in
  the roles it targets (with its callback URLs and descriptions), minus the names another source
  took over, and nothing of a stopped plugin; every call reaches the right handler exactly once
  (by ``call_id``) with the right converted arguments and result; a handler learns of a deadline
  or an abort (``CancelledError`` / ``ctx.cancelled`` and ``cancel_reason``); ``stop()`` returns
  within its grace period, never raises, reports the clear (``removed``) or the failure, and leaves
  no task, handler, listening socket or connection behind; errors have the documented codes; and
  no wait is unbounded (every wait has a timeout, so a hang is a failure, not a stuck run).

``test_every_tool_name_reaches_its_own_handler`` checks routing over the whole name space (R7: any
1-64 code points). The machine runs on an event loop of its own in a thread; its rules are plain
functions that run coroutines there. Both are bounded for CI (a few examples, derandomized, no
example database); ``TOOLPORT_PROPERTY_EXAMPLES=N`` hunts longer. ``test_regression_*`` pin the bugs
found while writing them (since fixed), each shrunk to its smallest case, so that CI checks those
cases every run whatever the properties happen to draw.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import os
import signal
import socket
import threading
import time
import uuid
from collections import defaultdict
from contextlib import contextmanager
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import pydantic
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

from toolport_plugin import PLUGIN_ERROR_CODES, CallContext, Plugin, PluginError, RegisteredEvent, ToolError

from .conftest import Api, Toolport, start_toolport

# ---- what the generated tools look like -----------------------------------------------------


class Query(pydantic.BaseModel):
    text: str
    limit: int = 3


@dataclass
class Window:
    days: int = 1


INTRUDER = "intruder"  # another source (not plugin:, so never evicted) that takes names over
INTRUDER_URL = "http://127.0.0.1:9/intruder"
WEIRD_ROLE = "Lan lan/é%2F?&#"
ROLE_SETS = [["default", "Mochi"], ["default"], ["default", "Mochi", WEIRD_ROLE], ["Mochi", WEIRD_ROLE]]
KINDS = ["echo_async", "echo_sync", "typed", "tool_error", "exception", "slow_async", "slow_sync"]
SLOW = ("slow_async", "slow_sync")
OUTAGES_PER_EXAMPLE = 1  # Toolport restarts or kills per example: each costs a Node start (~0.6 s)
SHORT_TIMEOUT = 0.4  # seconds: a slow tool's deadline that a test can afford to wait for
LONG_TIMEOUT = 5.0
# stop()'s grace periods tried (0: calls in flight are cancelled at once)
GRACES = [0, 0.05, 0.3]
MAX_JSON_INT = 2**53  # Toolport parses arguments with JSON.parse: larger integers lose precision

# Names that are hard to route by URL path: percent escapes ("%4F"), dot segments ("." and ".."),
# a line feed, "/", "?", "#" (see test_regression_tool_name_routing).
tool_names = st.one_of(
    st.sampled_from(["echo", "get_weather", "tool.v2", "a b", "a/b", "100%", "ünï😀", "x" * 64, "-_~", ".", ".."]),
    st.text("ab%4F./+ é😀_?#\n", min_size=1, max_size=6),
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-MAX_JSON_INT, MAX_JSON_INT) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


@dataclass(frozen=True)
class Spec:
    name: str
    kind: str
    timeout: float

    @property
    def description(self) -> str:
        return f"{self.kind} tool {self.name}"


class Ledger:
    """What the handlers saw, written from the loop and from worker threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: dict[str, list[tuple[str, str, str, Any]]] = defaultdict(list)  # call_id → [(tool, ctx.name, kind, args)]
        self.cancels: dict[str, list[str | None]] = defaultdict(list)  # call_id → [cancel_reason]
        self.started: dict[str, threading.Event] = defaultdict(threading.Event)
        self.running = 0
        self.deadlines: dict[str, int] = {}

    @contextmanager
    def enter(self, ctx: CallContext, tool: str, kind: str, args: Any) -> Iterator[None]:
        with self.lock:
            self.calls[ctx.call_id].append((tool, ctx.name, kind, args))
            self.deadlines[ctx.call_id] = ctx.deadline_ms
            self.running += 1
            started = self.started[ctx.call_id]
        started.set()
        try:
            yield
        finally:
            with self.lock:
                self.running -= 1

    def cancelled(self, ctx: CallContext) -> None:
        with self.lock:
            self.cancels[ctx.call_id].append(ctx.cancel_reason)

    def started_event(self, call_id: str) -> threading.Event:
        with self.lock:
            return self.started[call_id]


def make_handler(spec: Spec, ledger: Ledger) -> Callable[..., Any]:
    """One handler per spec; every handler records its call in the ledger first."""
    name, kind = spec.name, spec.kind
    if kind == "echo_async":
        async def echo_async(text: str, ctx: CallContext, n: int = 0) -> dict[str, Any]:
            with ledger.enter(ctx, name, kind, {"text": text, "n": n}):
                await asyncio.sleep(0)
                return {"tool": name, "text": text, "n": n}
        return echo_async
    if kind == "echo_sync":
        def echo_sync(text: str, ctx: CallContext, n: int = 0) -> dict[str, Any]:
            with ledger.enter(ctx, name, kind, {"text": text, "n": n}):
                return {"tool": name, "text": text, "n": n}
        return echo_sync
    if kind == "typed":
        async def typed(query: Query, window: Window, ctx: CallContext, unit: Literal["c", "f"] = "c") -> dict[str, Any]:
            with ledger.enter(ctx, name, kind, None):
                return {"tool": name, "query": query.model_dump(), "days": window.days, "unit": unit,
                        "types": [type(query).__name__, type(window).__name__]}
        return typed
    if kind == "tool_error":
        async def tool_error(message: str, ctx: CallContext, payload: Any = None) -> None:
            with ledger.enter(ctx, name, kind, {"message": message, "payload": payload}):
                raise ToolError(message, output=payload)
        return tool_error
    if kind == "exception":
        def exception(message: str, ctx: CallContext) -> None:
            with ledger.enter(ctx, name, kind, {"message": message}):
                raise ValueError(message)
        return exception
    if kind == "slow_async":
        async def slow_async(seconds: float, ctx: CallContext) -> dict[str, Any]:
            with ledger.enter(ctx, name, kind, {"seconds": seconds}):
                try:
                    await asyncio.sleep(seconds)
                except asyncio.CancelledError:
                    ledger.cancelled(ctx)
                    raise
                return {"tool": name, "slept": seconds}
        return slow_async
    assert kind == "slow_sync"

    def slow_sync(seconds: float, ctx: CallContext) -> dict[str, Any]:
        with ledger.enter(ctx, name, kind, {"seconds": seconds}):
            if ctx.cancelled.wait(seconds):
                ledger.cancelled(ctx)
                return {"tool": name, "cancelled": True}
            return {"tool": name, "slept": seconds}
    return slow_sync


def arguments_for(spec: Spec, data: st.DataObject) -> tuple[dict[str, Any], Callable[[dict[str, Any]], None]]:
    """Valid arguments for a call of ``spec``, and a check of the ToolResult they must give."""
    kind, name = spec.kind, spec.name
    if kind in ("echo_async", "echo_sync"):
        text = data.draw(st.text(max_size=20), label="text")
        n = data.draw(st.none() | st.integers(-MAX_JSON_INT, MAX_JSON_INT), label="n")
        args: dict[str, Any] = {"text": text} if n is None else {"text": text, "n": n}
        return args, _expect_output({"tool": name, "text": text, "n": n or 0})
    if kind == "typed":
        query: dict[str, Any] = {"text": data.draw(st.text(max_size=10), label="query.text")}
        limit = data.draw(st.none() | st.integers(0, 100), label="limit")
        if limit is not None:
            query["limit"] = limit
        days = data.draw(st.none() | st.integers(1, 30), label="days")
        unit = data.draw(st.sampled_from([None, "c", "f"]), label="unit")
        args = {"query": query, "window": {} if days is None else {"days": days}}
        if unit is not None:
            args["unit"] = unit
        return args, _expect_output({"tool": name, "query": {"text": query["text"], "limit": 3 if limit is None else limit},
                                     "days": days or 1, "unit": unit or "c", "types": ["Query", "Window"]})
    if kind == "tool_error":
        message = data.draw(st.text(min_size=1, max_size=12).filter(str.strip), label="message")
        payload = data.draw(json_values, label="payload")
        args = {"message": message} if payload is None else {"message": message, "payload": payload}
        return args, _expect_error(message, payload)
    if kind == "exception":
        message = data.draw(st.text(max_size=12), label="message")
        return {"message": message}, _expect_error(f"ValueError: {message}" if message else "ValueError", None)
    seconds = data.draw(st.sampled_from([0, 0.01, 0.03]), label="seconds")
    return {"seconds": seconds}, _expect_output({"tool": name, "slept": seconds})


def canonical_arguments(spec: Spec) -> tuple[dict[str, Any], Callable[[dict[str, Any]], None]]:
    """Fixed valid arguments for a call of ``spec`` (for the invariants, which draw nothing)."""
    name = spec.name
    return {
        "echo_async": ({"text": "ping"}, _expect_output({"tool": name, "text": "ping", "n": 0})),
        "echo_sync": ({"text": "ping"}, _expect_output({"tool": name, "text": "ping", "n": 0})),
        "typed": ({"query": {"text": "q"}, "window": {}}, _expect_output(
            {"tool": name, "query": {"text": "q", "limit": 3}, "days": 1, "unit": "c", "types": ["Query", "Window"]})),
        "tool_error": ({"message": "E"}, _expect_error("E", None)),
        "exception": ({"message": ""}, _expect_error("ValueError", None)),
        "slow_async": ({"seconds": 0}, _expect_output({"tool": name, "slept": 0})),
        "slow_sync": ({"seconds": 0}, _expect_output({"tool": name, "slept": 0})),
    }[spec.kind]


def invalid_arguments_for(spec: Spec, data: st.DataObject) -> dict[str, Any]:
    """Arguments the registered schema refuses (Toolport answers without calling the handler)."""
    required = {"echo_async": "text", "echo_sync": "text", "typed": "query", "tool_error": "message",
                "exception": "message", "slow_async": "seconds", "slow_sync": "seconds"}[spec.kind]
    how = data.draw(st.sampled_from(["missing", "wrong type", "unknown key"]), label="invalid")
    if how == "missing":
        return {}
    if how == "wrong type":
        return {required: [1, 2]}
    valid, _ = arguments_for(spec, data)
    return {**valid, "no such parameter": 1}


def _expect_output(output: Any) -> Callable[[dict[str, Any]], None]:
    def check(result: dict[str, Any]) -> None:
        assert result.get("is_error") is False, result
        assert result.get("output") == output, result
    return check


def _expect_error(error: str, output: Any) -> Callable[[dict[str, Any]], None]:
    def check(result: dict[str, Any]) -> None:
        assert result.get("is_error") is True, result
        assert result.get("error") == error, result
        assert result.get("output") == output, result
        assert "Traceback" not in result.get("text", ""), result
    return check


# ---- the environment: a Toolport of this module's own, and an event loop in a thread ---------


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="properties-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Awaitable[Any], timeout: float, what: str) -> Any:
        """Runs ``coro`` on the loop; a hang past ``timeout`` is a failure naming ``what``."""
        future = asyncio.run_coroutine_threadsafe(_within(coro, timeout, what), self.loop)
        done, _ = concurrent.futures.wait([future], timeout + 10)
        if not done:
            future.cancel()
            raise AssertionError(f"hung: {what} (the loop itself did not answer)")
        return future.result()

    def close(self) -> None:
        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.get_running_loop().shutdown_default_executor()
        asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


HARNESS = "properties-harness"  # the name of the tasks that run rules (not the plugin's)


async def _within(coro: Awaitable[Any], timeout: float, what: str) -> Any:
    asyncio.current_task().set_name(HARNESS)  # type: ignore[union-attr]

    async def named() -> Any:
        asyncio.current_task().set_name(HARNESS)  # type: ignore[union-attr]
        return await coro
    try:
        return await asyncio.wait_for(named(), timeout)
    except asyncio.TimeoutError:
        raise AssertionError(f"hung: {what} did not finish within {timeout} s") from None


async def until(predicate: Callable[[], Any], timeout: float, what: str) -> None:
    """Polls ``predicate`` (plain or async) until true, else fails naming ``what``."""
    started = time.monotonic()
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.03)


@dataclass
class Env:
    tp: Toolport
    loop: LoopThread
    ipv6: bool


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    tp = start_toolport(list(ROLE_SETS[0]))
    loop = LoopThread()
    yield Env(tp, loop, _ipv6_loopback())
    loop.close()
    tp.stop()


# ---- sockets of this process (Linux /proc), for the "stop leaves nothing behind" check -------


def _our_tcp_sockets() -> list[tuple[int, int, str]]:
    """(local port, remote port, state) of every TCP socket this process holds open."""
    inodes: set[str] = set()
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return []
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    states = {"01": "ESTABLISHED", "06": "TIME_WAIT", "08": "CLOSE_WAIT", "0A": "LISTEN"}
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[9] in inodes:
                found.append((int(cols[1].rsplit(":", 1)[1], 16), int(cols[2].rsplit(":", 1)[1], 16), states.get(cols[3], cols[3])))
    return found


# ---- the state machine ---------------------------------------------------------------------


class PluginMachine(RuleBasedStateMachine):
    env: Env  # set by the test before the machine runs
    _ids = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        self.tp = self.env.tp
        self.loop = self.env.loop
        self.up = True
        self.plugin: Plugin | None = None
        self.specs: dict[str, Spec] = {}
        self.role: str | None = None
        self.use_events = True
        self.intruder: set[tuple[str, str]] = set()  # (name, role) held by INTRUDER
        self.ledger = Ledger()
        self.registered: list[RegisteredEvent] = []
        self.errors: list[Any] = []
        self.last_port: tuple[str, int] | None = None
        self.outages = 0
        self.source = ""
        self.session: aiohttp.ClientSession | None = None
        self.call_ids = (f"call-{next(self._ids)}-{i}" for i in itertools.count())

    # ---- plumbing --------------------------------------------------------------------------

    def run(self, coro: Awaitable[Any], what: str, timeout: float = 20.0) -> Any:
        try:
            return self.loop.run(coro, timeout, what)
        except BaseException as err:
            # Shown with the captured output: when a step fails once but not on Hypothesis's replay
            # (timing), Hypothesis reports a Flaky* error that does not carry the first failure.
            print(f"step raised (maybe as expected): {what}: {type(err).__name__}: {err}")
            raise

    @initialize(data=st.data())
    def open_and_start_a_plugin(self, data: st.DataObject) -> None:
        async def go() -> None:
            # force_close: the test's own client keeps no idle socket to Toolport (the leak check).
            self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
            # Every example starts from the same Toolport (Hypothesis replays draws: they must
            # not depend on what the previous example left).
            if self.tp.roles != ROLE_SETS[0] or self.tp.proc is None or self.tp.proc.poll() is not None:
                self.tp.kill()
                self.tp.roles = list(ROLE_SETS[0])
                await asyncio.to_thread(self.tp.start)
        self.run(go(), "opening the client")
        self.source = f"plugin:prop-{uuid.uuid4().hex[:8]}"
        self.start_a_plugin(data)

    def teardown(self) -> None:
        async def go() -> None:
            try:
                if self.plugin is not None:
                    await self.plugin.stop(grace=0.05)
                    self.plugin = None
                if not self.up:
                    await asyncio.to_thread(self.tp.start)
                    self.up = True
                await self.post("/api/tools/clear", {"source": INTRUDER})
            finally:
                if self.session is not None:
                    await self.session.close()
        self.run(go(), "teardown", timeout=30)

    async def post(self, path: str, body: Any) -> dict[str, Any]:
        assert self.session is not None
        async with self.session.post(self.tp.url + path, data=json.dumps(body), headers={"content-type": "application/json"}) as res:
            answer = await res.json()
            assert res.status == 200, (path, body, res.status, answer)
            return answer

    async def registry(self) -> dict[str, list[dict[str, Any]]]:
        assert self.session is not None
        async with self.session.get(self.tp.url + "/api/tools") as res:
            assert res.status == 200
            return (await res.json())["tools_by_role"]

    async def call(self, role: str, name: str, arguments: Any, call_id: str) -> dict[str, Any]:
        return await self.post("/api/tools/call", {"role": role, "name": name, "arguments": arguments, "call_id": call_id})

    async def call_within_deadline(self, role: str, spec: Spec, arguments: Any, call_id: str) -> tuple[str, dict[str, Any]]:
        """A call whose handler answers well within its deadline (it sleeps 0.03 s at most).

        A short deadline (0.4 s) can still pass on a loaded machine before the handler answers (a
        sync handler waits for a worker thread), so such a timeout is retried, twice at most, under
        a new call id: timing never decides the outcome, and a handler that never answers still
        fails. Returns the call id of the answer and the answer.
        """
        result = await self.call(role, spec.name, arguments, call_id)
        for _ in range(2):
            if spec.timeout != SHORT_TIMEOUT or "timed out" not in str(result.get("error", "")):
                break
            call_id = next(self.call_ids)
            result = await self.call(role, spec.name, arguments, call_id)
        return call_id, result

    def targeted_roles(self) -> list[str]:
        if self.plugin is None:
            return []
        return [r for r in self.tp.roles if self.role is None or r == self.role]

    def expected(self) -> dict[str, set[tuple[str, str, str, str | None]]]:
        """Per role: (name, source, description, callback_url) of every row Toolport must list."""
        rows: dict[str, set[tuple[str, str, str, str | None]]] = {r: set() for r in self.tp.roles}
        for name, role in self.intruder:
            rows[role].add((name, INTRUDER, "intruder", None))
        if self.plugin is not None:
            for role in self.targeted_roles():
                for spec in self.specs.values():
                    if (spec.name, role) not in self.intruder:
                        rows[role].add((spec.name, self.source, spec.description, self.plugin.callback_url(spec.name)))
        return rows

    async def observed(self) -> dict[str, set[tuple[str, str, str, str | None]]]:
        return {role: {(t["name"], t["source"], t["description"], None if t["source"] == INTRUDER else t["callback_url"])
                       for t in tools}
                for role, tools in (await self.registry()).items()}

    async def settled(self, what: str, timeout: float = 8.0) -> None:
        """Waits until the registry is what the model says, else fails with the difference."""
        want = self.expected()
        started = time.monotonic()
        while True:
            try:
                got = await self.observed()
            except (aiohttp.ClientError, OSError):
                got = None
            if got == want:
                return
            if time.monotonic() - started > timeout:
                diff = {r: {"missing": sorted(map(str, want.get(r, set()) - (got or {}).get(r, set()))),
                            "unexpected": sorted(map(str, (got or {}).get(r, set()) - want.get(r, set())))}
                        for r in set(want) | set(got or {})}
                raise AssertionError(f"registry not as declared {timeout} s after {what}: {diff}")
            await asyncio.sleep(0.03)

    def ours(self) -> list[tuple[Spec, str]]:
        """(spec, role) of every tool Toolport routes to this plugin now."""
        return [(spec, role) for role in self.targeted_roles() for spec in self.specs.values()
                if (spec.name, role) not in self.intruder]

    def running_up(self) -> bool:
        return self.plugin is not None and self.up

    def has_ours(self) -> bool:
        return self.running_up() and bool(self.ours())

    def has_slow(self, timeout: float) -> bool:
        return self.running_up() and any(s.kind in SLOW and s.timeout == timeout for s, _ in self.ours())

    # ---- starting ----------------------------------------------------------------------------

    def new_plugin(self, data: st.DataObject, *, role: str | None, start_timeout: float = 5.0) -> Plugin:
        host = "127.0.0.1"
        if self.env.ipv6 and data.draw(st.booleans(), label="ipv6"):
            host = "::1"
        port = 0
        if self.last_port is not None and data.draw(st.booleans(), label="same port"):
            host, port = self.last_port
        self.use_events = data.draw(st.booleans(), label="use_events")
        plugin = Plugin(self.source, toolport_url=self.tp.url, role=role, host=host, port=port, use_events=self.use_events,
                        poll_interval=0.1, max_backoff=0.5, request_timeout=3.0, start_timeout=start_timeout)
        plugin.on("registered", self.registered.append)
        plugin.on("error", self.errors.append)
        return plugin

    def declare(self, plugin: Plugin, data: st.DataObject, refused_at: int | None = None) -> dict[str, Spec]:
        """Declares 1-4 generated tools; ``refused_at``: one more, at that index, whose schema
        Toolport refuses at registration (422) though the SDK took it when it was declared."""
        names = data.draw(st.lists(tool_names, min_size=1, max_size=4, unique=True), label="names")
        specs: dict[str, Spec] = {}
        for i, name in enumerate(names):
            if i == refused_at:
                self.declare_refused(plugin)
            kind = data.draw(st.sampled_from(KINDS), label="kind")
            timeout = data.draw(st.sampled_from([SHORT_TIMEOUT, LONG_TIMEOUT]), label="timeout") if kind in SLOW else LONG_TIMEOUT
            spec = Spec(name, kind, timeout)
            plugin.tool(make_handler(spec, self.ledger), name=name, description=spec.description, timeout_seconds=timeout)
            specs[name] = spec
        if refused_at is not None and refused_at >= len(names):
            self.declare_refused(plugin)
        return specs

    @staticmethod
    def declare_refused(plugin: Plugin) -> None:
        async def refused(x: str = "") -> str:
            return x
        # An unknown Unicode class: RE2 refuses it, and the SDK leaves that verdict to Toolport (a
        # pattern that surely fails, such as a lookahead, is refused when declared instead).
        schema = {"type": "object", "properties": {"x": {"type": "string", "pattern": "\\p{NoSuchClass}"}}}
        plugin.tool(refused, name="refused-" + uuid.uuid4().hex[:6], parameters=schema)

    @precondition(lambda self: self.plugin is None and self.up)
    @rule(data=st.data())
    def start_plugin(self, data: st.DataObject) -> None:
        how = data.draw(st.sampled_from(["ok", "ok", "ok", "unknown role", "refused schema", "stopped during start"]), label="how")
        if how == "ok":
            self.start_a_plugin(data)
        elif how == "stopped during start":
            self.stop_a_plugin_during_its_start(data)
        else:
            self.start_a_refused_plugin(data, unknown_role=how == "unknown role")

    def start_a_plugin(self, data: st.DataObject) -> None:
        role = data.draw(st.sampled_from([None, None, *self.tp.roles]), label="role")
        plugin = self.new_plugin(data, role=role)
        specs = self.declare(plugin, data)
        self.registered.clear()
        result = self.run(plugin.start(), "start()")
        self.plugin, self.specs, self.role = plugin, specs, role
        self.last_port = (plugin._server._host, int(plugin.url.rsplit(":", 1)[1]))
        assert plugin.is_running
        assert result.url == plugin.url
        assert result.names == list(specs)
        assert sorted(result.roles) == sorted(self.targeted_roles())
        assert [e.reason for e in self.registered] == ["start"]
        # Registering a name again replaces it in every target role (R5): the intruder lost them.
        self.intruder -= {(n, r) for n in specs for r in self.targeted_roles()}

    def stop_a_plugin_during_its_start(self, data: st.DataObject) -> None:
        """stop() while start() registers: start() raises TP_ERR_PLUGIN_STATE (or had finished),
        and nothing stays registered or running."""
        plugin = self.new_plugin(data, role=None)
        self.declare(plugin, data)
        delay = data.draw(st.sampled_from([0, 0.002, 0.008]), label="stop after")

        async def go() -> None:
            starting = asyncio.ensure_future(plugin.start())
            await asyncio.sleep(delay)
            stopped = await plugin.stop(grace=0.05)
            try:
                await starting
            except PluginError as err:
                assert err.code == "TP_ERR_PLUGIN_STATE", err
            assert stopped.error is None and (stopped.is_cleared or stopped.removed == 0), stopped
            await asyncio.sleep(0.1)  # a registration still in flight would land now
            await self.settled("a stop during start()", timeout=0.1)
            await self.assert_left_nothing(plugin)
        self.run(go(), "a stop during start()")

    def start_a_refused_plugin(self, data: st.DataObject, unknown_role: bool) -> None:
        """A 4xx answer raises at once, and whatever was registered is cleared (README)."""
        plugin = self.new_plugin(data, role="Nobody" if unknown_role else None)
        self.declare(plugin, data, refused_at=None if unknown_role else data.draw(st.integers(0, 4), label="refused at"))
        with pytest.raises(PluginError) as info:
            self.run(plugin.start(), "start() of a refused plugin")
        err = info.value
        assert err.code == "TP_ERR_PLUGIN_REFUSED", err
        if unknown_role:
            assert (err.status, err.toolport_code) == (404, "TP_ERR_ROLE_NOT_FOUND"), err
        else:
            assert (err.status, err.toolport_code) == (422, "TP_ERR_VALIDATION"), err
        assert not plugin.is_running
        self.run(self.assert_left_nothing(plugin), "leftovers of a failed start()")
        with pytest.raises(PluginError) as again:
            self.run(plugin.start(), "start() again")
        assert again.value.code == "TP_ERR_PLUGIN_STATE"

    @precondition(lambda self: self.plugin is None and not self.up)
    @rule(data=st.data(), start_timeout=st.sampled_from([0, 0.2]))
    def start_plugin_while_toolport_is_down(self, data: st.DataObject, start_timeout: float) -> None:
        plugin = self.new_plugin(data, role=None, start_timeout=start_timeout)
        self.declare(plugin, data)
        started = time.monotonic()
        with pytest.raises(PluginError) as info:
            self.run(plugin.start(), "start() with Toolport down")
        took = time.monotonic() - started
        want = "TP_ERR_PLUGIN_UNREACHABLE" if start_timeout == 0 else "TP_ERR_PLUGIN_START_TIMEOUT"
        assert info.value.code == want, info.value
        assert took < start_timeout + 1.5, took
        self.run(self.assert_left_nothing(plugin), "leftovers of a failed start()")

    # ---- stopping ----------------------------------------------------------------------------

    async def assert_left_nothing(self, plugin: Plugin, port: int | None = None) -> None:
        """No task, running handler, listening socket or connection of the plugin is left."""
        def left() -> list[asyncio.Task[Any]]:
            return [t for t in asyncio.all_tasks() if t.get_name() != HARNESS and not t.done()]
        await until(lambda: not left(), 2.0, f"tasks left after stop: {left()}")
        await until(lambda: self.ledger.running == 0, 2.0, f"{self.ledger.running} handler(s) still running after stop")
        port = port or plugin._server._bound_port  # a failed start() had bound one too
        ports = {port} if port else set()
        await until(lambda: not [s for s in _our_tcp_sockets() if s[0] in ports or s[1] == self.tp.port], 2.0,
                    f"sockets left after stop: {[s for s in _our_tcp_sockets() if s[0] in ports or s[1] == self.tp.port]}")
        if port:
            host = plugin._server._host
            with pytest.raises(ConnectionRefusedError):  # the callback port is closed
                await asyncio.wait_for(asyncio.open_connection(host, port), 2)
        assert not plugin.is_running

    def stop_and_check(self, grace: float, in_flight: tuple[asyncio.Future[Any], str] | None = None) -> None:
        plugin = self.plugin
        assert plugin is not None
        port = int(plugin.url.rsplit(":", 1)[1])
        want_removed = len(self.ours()) if self.up else 0

        async def go() -> None:
            started = time.monotonic()
            result = await plugin.stop(grace=grace)
            took = time.monotonic() - started
            # Then nothing: a second stop() gives the same result, and start() is refused.
            assert await plugin.stop() == result
            with pytest.raises(PluginError) as info:
                await plugin.start()
            assert info.value.code == "TP_ERR_PLUGIN_STATE"
            if self.up and self.role is not None and self.role not in self.tp.roles:
                # Its role went away with a restart: Toolport refuses a clear of a role it lacks (R17).
                assert (result.is_cleared, result.removed) == (False, 0), result
                assert isinstance(result.error, PluginError) and result.error.status == 404, result
            elif self.up:
                assert (result.is_cleared, result.removed, result.error) == (True, want_removed, None), result
            else:
                assert (result.is_cleared, result.removed) == (False, 0), result
                assert isinstance(result.error, PluginError) and result.error.code == "TP_ERR_PLUGIN_UNREACHABLE", result
            # stop() waits for calls in flight for `grace` seconds at most (plus a clear's round trip).
            assert took < grace + 2.0, f"stop(grace={grace}) took {took:.2f} s"
            if in_flight is not None:
                call, call_id = in_flight
                result_of_call = await asyncio.wait_for(call, 5)
                assert result_of_call["is_error"] is True, result_of_call
                await until(lambda: self.ledger.cancels.get(call_id), 2.0, "the handler in flight learnt of the stop")
                assert self.ledger.cancels[call_id] == ["disconnected"], self.ledger.cancels[call_id]
            await self.assert_left_nothing(plugin, port)
        self.run(go(), f"stop(grace={grace})")
        self.plugin, self.specs = None, {}

    @precondition(lambda self: self.plugin is not None)
    @rule(grace=st.sampled_from(GRACES))
    def stop_plugin(self, grace: float) -> None:
        self.stop_and_check(grace)

    @precondition(lambda self: self.has_slow(LONG_TIMEOUT))
    @rule(data=st.data(), grace=st.sampled_from(GRACES))
    def stop_plugin_during_a_call(self, data: st.DataObject, grace: float) -> None:
        spec, role = data.draw(st.sampled_from([(s, r) for s, r in self.ours() if s.kind in SLOW and s.timeout == LONG_TIMEOUT]))
        call_id = next(self.call_ids)

        async def begin() -> asyncio.Future[Any]:
            call = asyncio.ensure_future(self.call(role, spec.name, {"seconds": 30}, call_id))
            started = self.ledger.started_event(call_id)
            await until(started.is_set, 5, "the slow handler started")
            return call
        call = self.run(begin(), "a slow call")
        self.stop_and_check(grace, (call, call_id))
        assert len(self.ledger.calls[call_id]) == 1

    # ---- calls -------------------------------------------------------------------------------

    def check_reached_once(self, call_id: str, spec: Spec) -> None:
        seen = self.ledger.calls.get(call_id, [])
        assert [(tool, ctx_name, kind) for tool, ctx_name, kind, _ in seen] == [(spec.name, spec.name, spec.kind)], (call_id, seen)
        deadline = self.ledger.deadlines[call_id]
        assert 0 < deadline <= spec.timeout * 1000, (deadline, spec)

    @precondition(lambda self: self.has_ours())
    @rule(data=st.data())
    def call_a_tool(self, data: st.DataObject) -> None:
        spec, role = data.draw(st.sampled_from(self.ours()), label="tool")
        args, check = arguments_for(spec, data)
        call_id, result = self.run(self.call_within_deadline(role, spec, args, next(self.call_ids)), f"a call of {spec.name!r}")
        check(result)
        self.check_reached_once(call_id, spec)

    @precondition(lambda self: self.has_ours())
    @rule(data=st.data(), n=st.integers(2, 6))
    def call_tools_concurrently(self, data: st.DataObject, n: int) -> None:
        planned = []
        for _ in range(n):
            spec, role = data.draw(st.sampled_from(self.ours()), label="tool")
            args, check = arguments_for(spec, data)
            planned.append((spec, role, args, check, next(self.call_ids)))

        async def go() -> list[tuple[str, dict[str, Any]]]:
            return list(await asyncio.gather(*(self.call_within_deadline(role, spec, args, cid) for spec, role, args, _, cid in planned)))
        answers = self.run(go(), f"{n} concurrent calls")
        for (spec, _, _, check, _), (call_id, result) in zip(planned, answers):
            check(result)
            self.check_reached_once(call_id, spec)

    @precondition(lambda self: self.has_ours())
    @rule(data=st.data())
    def call_with_invalid_arguments(self, data: st.DataObject) -> None:
        spec, role = data.draw(st.sampled_from(self.ours()), label="tool")
        args = invalid_arguments_for(spec, data)
        call_id = next(self.call_ids)
        result = self.run(self.call(role, spec.name, args, call_id), "a call with invalid arguments")
        assert result["is_error"] is True, result
        assert call_id not in self.ledger.calls, "the handler ran although the arguments were invalid"

    @precondition(lambda self: self.has_slow(SHORT_TIMEOUT))
    @rule(data=st.data())
    def call_past_the_deadline(self, data: st.DataObject) -> None:
        spec, role = data.draw(st.sampled_from([(s, r) for s, r in self.ours() if s.kind in SLOW and s.timeout == SHORT_TIMEOUT]))
        call_id = next(self.call_ids)

        async def go() -> dict[str, Any]:
            result = await self.call(role, spec.name, {"seconds": 30}, call_id)
            await until(lambda: self.ledger.cancels.get(call_id), 3.0, "the handler learnt of the deadline")
            return result
        result = self.run(go(), "a call past its deadline")
        assert result["is_error"] is True, result
        self.check_reached_once(call_id, spec)
        # Toolport's deadline and the SDK's own are the same: whichever ends the call first.
        assert self.ledger.cancels[call_id] in (["deadline"], ["disconnected"]), self.ledger.cancels[call_id]

    @precondition(lambda self: self.has_slow(LONG_TIMEOUT))
    @rule(data=st.data())
    def abort_a_call(self, data: st.DataObject) -> None:
        """The caller hangs up: Toolport aborts the dispatch, and the handler learns of it."""
        spec, role = data.draw(st.sampled_from([(s, r) for s, r in self.ours() if s.kind in SLOW and s.timeout == LONG_TIMEOUT]))
        call_id = next(self.call_ids)

        async def go() -> None:
            call = asyncio.ensure_future(self.call(role, spec.name, {"seconds": 30}, call_id))
            await until(self.ledger.started_event(call_id).is_set, 5, "the slow handler started")
            call.cancel()
            await asyncio.gather(call, return_exceptions=True)
            await until(lambda: self.ledger.cancels.get(call_id), 3.0, "the handler learnt of the abort")
        self.run(go(), "an aborted call")
        self.check_reached_once(call_id, spec)
        assert self.ledger.cancels[call_id] == ["disconnected"], self.ledger.cancels[call_id]

    # ---- what others do to the registry ------------------------------------------------------

    @precondition(lambda self: self.has_ours())
    @rule(data=st.data(), everywhere=st.booleans())
    def someone_unregisters_a_tool(self, data: st.DataObject, everywhere: bool) -> None:
        spec, role = data.draw(st.sampled_from(self.ours()), label="tool")
        self.registered.clear()
        answer = self.run(self.post("/api/tools/unregister", {"name": spec.name, "role": None if everywhere else role,
                                                              "expected_source": self.source}), "unregister")
        assert answer["removed"] is True, answer
        self.run(self.settled("an unregister"), "settling")
        names = {n for e in self.registered if e.reason == "restored" for n in e.names}
        assert spec.name in names, self.registered

    @precondition(lambda self: self.has_ours())
    @rule(data=st.data())
    def someone_clears_the_source(self, data: st.DataObject) -> None:
        role = data.draw(st.sampled_from([None, *sorted({r for _, r in self.ours()})]), label="role")
        self.registered.clear()
        answer = self.run(self.post("/api/tools/clear", {"source": self.source, "role": role}), "clear")
        assert answer["removed"] >= 1, answer
        self.run(self.settled("a clear"), "settling")
        self.check_restored(role)

    @precondition(lambda self: self.has_ours())
    @rule(data=st.data())
    def another_source_takes_a_name_over(self, data: st.DataObject) -> None:
        spec, role = data.draw(st.sampled_from(self.ours()), label="tool")
        self.run(self.post("/api/tools/register", {"name": spec.name, "description": "intruder", "callback_url": INTRUDER_URL,
                                                   "source": INTRUDER, "role": role}), "the intruder's register")
        self.intruder.add((spec.name, role))
        # The plugin leaves it alone (no tug of war), however often it checks.
        self.run(asyncio.sleep(0.15 if not self.use_events else 0.05), "a pause")

    @precondition(lambda self: self.up and bool(self.intruder))
    @rule(data=st.data())
    def the_other_source_gives_it_back(self, data: st.DataObject) -> None:
        name, role = data.draw(st.sampled_from(sorted(self.intruder)), label="taken")
        answer = self.run(self.post("/api/tools/unregister", {"name": name, "role": role, "expected_source": INTRUDER}), "unregister")
        assert answer["removed"] is True, answer
        self.intruder.discard((name, role))
        self.run(self.settled("the intruder's unregister"), "settling")

    @precondition(lambda self: self.has_ours())
    @rule(data=st.data())
    def the_origin_is_evicted(self, data: st.DataObject) -> None:
        """Three connection failures evict the origin (R13); the plugin registers again."""
        assert self.plugin is not None
        server = self.plugin._server
        spec, role = data.draw(st.sampled_from(self.ours()), label="tool")
        args, _ = arguments_for(spec, data)

        async def go() -> None:
            await server._suspend()
            try:
                for _ in range(3):
                    call_id = next(self.call_ids)
                    result = await self.call(role, spec.name, args, call_id)
                    assert result["is_error"] is True, result
                    assert call_id not in self.ledger.calls
            finally:
                await server._resume()
            await self.settled("an eviction")
        self.run(go(), "an eviction")

    # ---- Toolport's life ---------------------------------------------------------------------

    def forget_registrations(self, roles: list[str]) -> None:
        self.tp.roles = list(roles)
        self.intruder.clear()  # registrations are runtime only (R3)

    @precondition(lambda self: self.up and self.outages < OUTAGES_PER_EXAMPLE)
    @rule(roles=st.sampled_from(ROLE_SETS), then_stop=st.sampled_from([None, None, 0.0, 0.05]))
    def restart_toolport(self, roles: list[str], then_stop: float | None) -> None:
        """Toolport restarts on the same port (SIGKILL: its registry is gone); the plugin registers
        again, or (``then_stop``) is stopped while it may be doing so: nothing may land after."""
        self.outages += 1
        self.registered.clear()
        self.tp.kill()
        self.forget_registrations(roles)
        self.run(asyncio.to_thread(self.tp.start), "Toolport's start")
        if then_stop is None or self.plugin is None:
            self.run(self.settled("a Toolport restart"), "settling")
            self.check_restored()
            return
        plugin = self.plugin
        port = int(plugin.url.rsplit(":", 1)[1])
        at_most = len(self.ours())

        async def go() -> None:
            await asyncio.sleep(then_stop)
            result = await plugin.stop(grace=0.05)
            if self.role is not None and self.role not in self.tp.roles:
                assert not result.is_cleared and result.error is not None and result.error.status == 404, result
            else:
                assert result.is_cleared and result.error is None and 0 <= result.removed <= at_most, result
            self.plugin, self.specs = None, {}
            await asyncio.sleep(0.3)  # a registration in flight would land now
            await self.settled("a stop during the re-registration", timeout=0.1)
            await self.assert_left_nothing(plugin, port)
        self.run(go(), "a stop right after a restart")

    @precondition(lambda self: self.up and self.outages < OUTAGES_PER_EXAMPLE)
    @rule()
    def kill_toolport(self) -> None:
        self.outages += 1
        self.tp.kill()
        self.up = False
        self.forget_registrations(self.tp.roles)

    @precondition(lambda self: not self.up)
    @rule(roles=st.sampled_from(ROLE_SETS))
    def start_toolport_again(self, roles: list[str]) -> None:
        self.registered.clear()
        self.forget_registrations(roles)
        self.run(asyncio.to_thread(self.tp.start), "Toolport's start")
        self.up = True
        self.run(self.settled("Toolport's start"), "settling")
        self.check_restored()

    def check_restored(self, role: str | None = None) -> None:
        """The plugin said what it registered again: "restored" events naming the tools and roles."""
        if self.plugin is None:
            return
        lost = {(s.name, r) for s, r in self.ours() if role is None or r == role}
        names = {n for e in self.registered if e.reason == "restored" for n in e.names}
        roles = {r for e in self.registered if e.reason == "restored" for r in e.roles}
        assert names >= {n for n, _ in lost} and roles >= {r for _, r in lost}, (lost, self.registered)

    # ---- invariants --------------------------------------------------------------------------

    @invariant()
    def registry_is_what_the_plugin_declares_and_every_tool_answers(self) -> None:
        if not self.up:
            return
        self.run(self.settled("the last step"), "settling")
        # One call of each tool the plugin has (in one of its roles), all at once.
        planned, seen = [], set()
        for spec, role in self.ours():
            if spec.name not in seen:
                seen.add(spec.name)
                args, check = canonical_arguments(spec)
                planned.append((spec, role, args, check, next(self.call_ids)))

        async def go() -> list[tuple[str, dict[str, Any]]]:
            return list(await asyncio.gather(*(self.call_within_deadline(role, spec, args, cid) for spec, role, args, _, cid in planned)))
        for (spec, _, _, check, _), (call_id, result) in zip(planned, self.run(go(), "a call of every tool")):
            check(result)
            self.check_reached_once(call_id, spec)

    @invariant()
    def background_errors_are_plugin_errors(self) -> None:
        for err in self.errors:
            assert isinstance(err, PluginError) and err.code in PLUGIN_ERROR_CODES, err

    @invariant()
    def the_watch_mode_is_as_asked(self) -> None:
        """With the event stream on, the plugin follows it again once Toolport is back; with
        ``use_events=False`` it polls."""
        plugin = self.plugin
        if plugin is None or not self.up:
            return
        if self.use_events:
            self.run(until(lambda: plugin.watch_mode == "events", 5, "following the event stream"), "the watch mode")
        else:  # also after an outage (test_regression_use_events_false_is_kept_after_an_outage)
            assert plugin.watch_mode == "polling"


# Shrinking a failure of this machine replays real restarts and deadlines for minutes: off unless
# asked for (TOOLPORT_PROPERTY_SHRINK=1) when hunting a bug down; a failure prints its steps anyway.
# TOOLPORT_PROPERTY_EXAMPLES=N runs a longer hunt (random, not derandomized) than CI's 5 examples.
PHASES = [Phase.explicit, Phase.reuse, Phase.generate, *([Phase.shrink] if os.environ.get("TOOLPORT_PROPERTY_SHRINK") else [])]
HUNT = int(os.environ.get("TOOLPORT_PROPERTY_EXAMPLES", "0"))


@pytest.mark.timeout(300)
# The SDK's backoff jitter calls random.random() on the loop thread while Hypothesis draws on this one.
@pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies")
def test_the_plugin_keeps_its_promises_whatever_happens(env: Env) -> None:
    PluginMachine.env = env
    run_state_machine_as_test(PluginMachine, settings=settings(
        max_examples=HUNT or 5, stateful_step_count=8, deadline=None, derandomize=not HUNT, database=None, phases=PHASES,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    ))


# ---- every name a tool may have (R7: 1-64 code points) reaches its own handler -------------------


any_tool_name = st.one_of(tool_names, st.text(min_size=1, max_size=64))


@settings(max_examples=10, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(names=st.lists(any_tool_name, min_size=1, max_size=6, unique=True))
def test_every_tool_name_reaches_its_own_handler(env: Env, names: list[str]) -> None:
    """Routing by name: the registered callback URL is the plugin's, and a call of each name
    through Toolport runs that name's handler (never a 404, never another tool's)."""
    async def go() -> None:
        role = env.tp.roles[0]
        plugin = Plugin(f"prop-{uuid.uuid4().hex[:8]}", toolport_url=env.tp.url, role=role, resync_interval=60)
        for name in names:
            plugin.tool(_answers_its_name(name), name=name)
        async with plugin, aiohttp.ClientSession() as session:
            api = Api(session, env.tp)
            rows = {t["name"]: t["callback_url"] for t in (await api.tools(role))[role] if t["source"] == plugin.source}
            assert rows == {name: plugin.callback_url(name) for name in names}
            for name in names:
                status, result = await api.post("/api/tools/call", {"role": role, "name": name, "arguments": {}})
                assert (status, result.get("is_error"), result.get("output")) == (200, False, f"handler of {name}"), (name, result)
    if env.tp.proc is None or env.tp.proc.poll() is not None:
        env.tp.start()
    env.loop.run(go(), 20, f"calls of {names!r}")


# ---- regression tests: the bugs the machine found, each shrunk to its smallest case ------------


def _answers_its_name(name: str) -> Callable[..., Any]:
    async def handler() -> str:
        return f"handler of {name}"
    return handler


def _new_plugin(api: Api, **options: Any) -> Plugin:
    return Plugin(f"prop-{uuid.uuid4().hex[:8]}", toolport_url=api.tp.url, poll_interval=0.3, **options)


# The callback server routes a call by the tool's name in its URL path; these names once did not
# survive the trip. Each must be stored by Toolport as the plugin's callback_url and run its own
# handler:
# - "a%41b" (next to a tool "aAb"): the path is percent-decoded exactly once (the server once
#   decoded aiohttp's already-decoded request.path again and ran the handler of "aAb");
# - "." and "..": their segments are "=." and "=.." (a bare or %2e-spelt dot segment is removed by
#   URL canonicalisation: Toolport stored ".../tools/" or "/<secret>/" and every call was a 404);
# - "x\ny": the catch-all route matches a decoded line feed ("/{tail:.*}" did not: aiohttp's own
#   404 answered before the SDK's handler ran).
@pytest.mark.parametrize("name, others", [("a%41b", ["aAb"]), (".", []), ("..", []), ("x\ny", [])],
                         ids=["percent-escape", "dot", "dot-dot", "line-feed"])
async def test_regression_tool_name_routing(api: Api, name: str, others: list[str]) -> None:
    plugin = _new_plugin(api, role="default")
    for each in (name, *others):
        plugin.tool(_answers_its_name(each), name=each)
    async with plugin:
        rows = {t["name"]: t for t in (await api.tools("default"))["default"] if t["source"] == plugin.source}
        assert rows[name]["callback_url"] == plugin.callback_url(name), rows[name]
        result = await asyncio.wait_for(api.call(name, {}), 10)
        assert (result["is_error"], result["output"]) == (False, f"handler of {name}"), result


# stop(grace=0) cancels calls in flight at once (the handler sees "disconnected"), not at their
# deadline: aiohttp's ceil_timeout() reads a shutdown timeout <= 0 as "no timeout", so the SDK
# must not hand it grace=0 as is (aiohttp/web_protocol.py RequestHandler.shutdown).
async def test_regression_stop_with_no_grace_cancels_calls_in_flight_at_once(api: Api) -> None:
    plugin = _new_plugin(api)
    started = asyncio.Event()
    reasons: list[str | None] = []

    @plugin.tool(timeout_seconds=1)
    async def slow(ctx: CallContext) -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            reasons.append(ctx.cancel_reason)
            raise
        return "too late"

    await plugin.start()
    call = asyncio.create_task(api.call("slow", {}))
    try:
        await asyncio.wait_for(started.wait(), 10)
        begun = time.monotonic()
        stopped = await asyncio.wait_for(plugin.stop(grace=0), 10)
        took = time.monotonic() - begun
    finally:
        await asyncio.wait_for(plugin.stop(), 10)
        result = await asyncio.wait_for(call, 10)
    assert stopped.is_cleared
    assert result["is_error"] is True
    assert reasons == ["disconnected"]
    assert took < 0.5, f"stop(grace=0) took {took:.2f} s: it waited for the call's 1 s deadline"


# A plugin made with use_events=False keeps polling after an outage: when a check succeeds again
# the plugin retries the event stream only if the option asks for it (the option once shared one
# flag with the fallback to polling, and the stream was turned on after any failed check).
def test_regression_use_events_false_is_kept_after_an_outage(env: Env) -> None:
    async def go() -> None:
        plugin = Plugin(f"prop-{uuid.uuid4().hex[:8]}", toolport_url=env.tp.url, use_events=False,
                        poll_interval=0.1, max_backoff=0.2, request_timeout=0.3)
        errors: list[PluginError] = []
        restored: list[RegisteredEvent] = []
        plugin.on("error", errors.append)
        plugin.on("registered", lambda event: restored.append(event) if event.reason == "restored" else None)
        plugin.tool(_answers_its_name("echo"), name="echo")
        async with plugin, aiohttp.ClientSession() as session:
            assert plugin.watch_mode == "polling"
            assert env.tp.proc is not None
            env.tp.proc.send_signal(signal.SIGSTOP)  # an outage: Toolport answers nothing for a while
            try:
                await until(lambda: errors, 5, "a failed check")
            finally:
                env.tp.proc.send_signal(signal.SIGCONT)
            # A check succeeds again: take the tool away and see the plugin put it back.
            await Api(session, env.tp).post("/api/tools/unregister", {"name": "echo", "expected_source": plugin.source})
            await until(lambda: restored, 5, "echo registered again")
            await asyncio.sleep(0.3)
            assert plugin.watch_mode == "polling"
    env.loop.run(go(), 20, "the use_events=False regression")
