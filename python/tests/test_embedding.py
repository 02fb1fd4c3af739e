"""The plugin SDK embedded in real Python programs, against a real Toolport over real sockets.

A user does more than ``plugin.run()`` in a script. What is checked here, each against what
README.md "Python plugin SDK" and python/README.md promise (or, where they say the SDKs behave
alike, against the TypeScript SDK's README "Plugin SDK"):

- several plugins in one process and one event loop: the same tool name in overlapping roles is
  handed from one to the other as they start and stop (a Hypothesis property over roles and
  start/stop orders); the same fixed port is refused with ``TP_ERR_PLUGIN_LISTEN``;
- lifecycle embedding: ``start()``/``stop()`` in an aiohttp application's startup/cleanup hooks
  (the app's own routes calling the tools through Toolport on the same loop), ``start()`` twice at
  once, a plugin reused after ``stop()``, ``run()`` inside a running loop, ``run()`` when the
  plugin is stopped by its own tool, a signal arriving during ``start()``, ``stop(grace=…)`` with a
  call in flight (released before or after the grace by a timer on the same loop);
- ``start()`` that does not finish (cancelled as Ctrl-C under ``asyncio.run`` does, ``stop()``
  meanwhile, a request timeout) leaves nothing registered (a Hypothesis property, through a
  loopback proxy in front of the real Toolport that holds one registration's answer);
- handlers: contextvars, ``asyncio.current_task()``, tasks they spawn (a Hypothesis property over
  concurrent sync/async calls); sync handlers that block (the loop, other calls and the event
  stream go on; the SDK's own requests to Toolport do not wait for them); deadlines while a
  handler awaits shielded work; odd handlers (a callable object, a plain function that returns an
  awaitable);
- logging: the ``toolport_plugin`` logger, nothing at WARNING in a normal life, and no argument,
  output, token, plugin key or callback secret in any log record;
- ``asyncio.run()`` and ``plugin.run()`` under PYTHONDEVMODE with ResourceWarnings as errors, ended
  by SIGINT/SIGTERM: the tools are cleared and no "Unclosed", "never awaited" or "Task was
  destroyed" warning is printed.

Child processes run small programs written to ``tmp_path`` with the SDK from python/src. Hang
guards are generous; no wall-clock measurement decides a result (the grace test orders two timers
of one event loop, 0.6 s apart). ``TOOLPORT_PROPERTY_EXAMPLES=N`` runs the
properties longer.
"""
from __future__ import annotations

import asyncio
import contextvars
import gc
import logging
import os
import signal
import sys
import textwrap
import threading
import uuid
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from toolport_plugin import CallContext, Plugin, PluginError, ToolError

from .conftest import REPO, Api, Toolport, serve_on_loopback, unstarted_toolport

HUNT = int(os.environ.get("TOOLPORT_PROPERTY_EXAMPLES", "0"))
# As in test_properties.py: shrinking replays real plugins and waits, so it is off unless asked
# for (TOOLPORT_PROPERTY_SHRINK=1); a failure prints its draws anyway.
PHASES = [Phase.explicit, Phase.reuse, Phase.generate, *([Phase.shrink] if os.environ.get("TOOLPORT_PROPERTY_SHRINK") else [])]


def examples(default: int) -> Any:
    return settings(max_examples=HUNT or default, deadline=None, derandomize=not HUNT, database=None, phases=PHASES,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def new_plugin(url: str, **options: Any) -> Plugin:
    options.setdefault("poll_interval", 0.3)
    options.setdefault("max_backoff", 1.0)
    return Plugin(f"emb-{uuid.uuid4().hex[:10]}", toolport_url=url, **options)


def answers(text: str) -> Callable[..., Awaitable[str]]:
    async def handler() -> str:
        return text
    return handler


async def echo(text: str) -> str:
    return text


async def rows_of(session: aiohttp.ClientSession, tp: Toolport) -> dict[str, list[dict[str, Any]]]:
    async with session.get(tp.url + "/api/tools") as res:
        assert res.status == 200
        return (await res.json())["tools_by_role"]


async def call(session: aiohttp.ClientSession, tp: Toolport, name: str, arguments: Any, role: str = "default") -> dict[str, Any]:
    async with session.post(tp.url + "/api/tools/call", json={"role": role, "name": name, "arguments": arguments}) as res:
        assert res.status == 200
        return await res.json()


async def eventually(check: Callable[[], Awaitable[Any]], what: str, timeout: float = 10.0) -> None:
    """Retries ``check`` (an async function that asserts) until it passes; the last failure is
    the test's failure after ``timeout`` (a hang guard, not a timing requirement)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            await check()
            return
        except AssertionError:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"{what}: not reached within {timeout} s") from None
        await asyncio.sleep(0.05)


async def source_rows(session: aiohttp.ClientSession, tp: Toolport, source: str) -> list[tuple[str, str]]:
    return sorted((role, row["name"]) for role, rows in (await rows_of(session, tp)).items() for row in rows
                  if row.get("source") == source)


async def is_closed(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/", json={}):
                return False
    except aiohttp.ClientConnectionError:
        return True


# ---- child processes -----------------------------------------------------------------------------


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLPORT_")}
    env["PYTHONPATH"] = str(REPO / "python" / "src")
    env.update(extra)
    return env


@pytest.fixture
async def children() -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """The child processes a test spawns; any still running when it ends (a failed assertion
    before its signal) is killed."""
    procs: list[asyncio.subprocess.Process] = []
    yield procs
    for proc in procs:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def spawn(children: list[asyncio.subprocess.Process], tmp_path: Path, source: str, *args: str,
                **env: str) -> asyncio.subprocess.Process:
    script = tmp_path / f"embedding_{uuid.uuid4().hex[:8]}.py"
    script.write_text(textwrap.dedent(source))
    proc = await asyncio.create_subprocess_exec(sys.executable, str(script), *args, env=child_env(**env),
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    children.append(proc)
    return proc


async def read_until(stream: asyncio.StreamReader | None, marker: bytes, seen: list[bytes], timeout: float = 20) -> None:
    assert stream is not None

    async def go() -> None:
        while True:
            line = await stream.readline()
            if not line:
                raise AssertionError(f"the child ended before {marker!r}: {b''.join(seen).decode(errors='replace')}")
            seen.append(line)
            if marker in line:
                return
    await asyncio.wait_for(go(), timeout)


async def finish(proc: asyncio.subprocess.Process, guard: float) -> tuple[int | None, str, str]:
    """Waits up to ``guard`` seconds for the child to exit (else kills it: returncode None)."""
    try:
        out, err = await asyncio.wait_for(proc.communicate(), guard)
        return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")
    except asyncio.TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        return None, out.decode(errors="replace"), err.decode(errors="replace")


# ---- several plugins in one loop -----------------------------------------------------------------


@examples(4)
@given(roles=st.lists(st.sampled_from([None, "default", "Mochi"]), min_size=2, max_size=3), data=st.data())
def test_several_plugins_in_one_loop_hand_a_shared_tool_name_to_each_other(
        toolport: Toolport, roles: list[str | None], data: st.DataObject) -> None:
    """README "Python plugin SDK" → Keeping registrations alive: a name another source took over
    is left alone (R5: the last registration wins); when that source stops and clears (R16), the
    plugins still running that target the role register it again. Several plugins share one
    event loop; each call reaches the plugin Toolport lists for the role."""
    start_order = data.draw(st.permutations(range(len(roles))), "start order")
    stop_order = data.draw(st.permutations(range(len(roles))), "stop order")
    tag = uuid.uuid4().hex[:8]
    shared = f"shared_{tag}"

    def targets(i: int, role: str) -> bool:
        return roles[i] is None or roles[i] == role

    async def go() -> None:
        plugins = [new_plugin(toolport.url, role=role) for role in roles]
        for i, plugin in enumerate(plugins):
            plugin.tool(answers(f"plugin {i}"), name=shared)
            plugin.tool(answers(f"own {i}"), name=f"own_{tag}_{i}")
        sources = {p.source: i for i, p in enumerate(plugins)}
        running: list[int] = []
        async with aiohttp.ClientSession() as session:
            try:
                for i in start_order:
                    await plugins[i].start()
                    running.append(i)
                # Right after the starts: the last one started that targets a role holds the name.
                listed = await rows_of(session, toolport)
                for role in ("default", "Mochi"):
                    owners = [i for i in running if targets(i, role)]
                    holder = [sources.get(r["source"]) for r in listed[role] if r["name"] == shared]
                    assert holder == ([owners[-1]] if owners else []), (role, holder, owners)

                async def settled() -> None:
                    listed = await rows_of(session, toolport)
                    for role in ("default", "Mochi"):
                        owners = [i for i in running if targets(i, role)]
                        holder = [sources.get(r["source"]) for r in listed[role] if r["name"] == shared]
                        if not owners:
                            assert holder == [], (role, holder)
                            continue
                        assert len(holder) == 1 and holder[0] in owners, (role, holder, owners)
                        result = await call(session, toolport, shared, {}, role)
                        assert result == {"is_error": False, "output": f"plugin {holder[0]}", "text": f"plugin {holder[0]}"}, result
                        own = {r["name"] for r in listed[role]}
                        for i in range(len(plugins)):
                            assert (f"own_{tag}_{i}" in own) == (i in running and targets(i, role)), (role, i, own)
                await settled()
                for i in stop_order:
                    stopped = await plugins[i].stop()
                    running.remove(i)
                    assert stopped.is_cleared and stopped.error is None, stopped
                    await eventually(settled, f"after plugin {i} stopped (running: {running})")
            finally:
                await asyncio.gather(*(p.stop(grace=0) for p in plugins))
    asyncio.run(asyncio.wait_for(go(), 90))


async def test_two_plugins_on_the_same_fixed_port_the_second_is_refused_with_listen(api: Api) -> None:
    """README "Python plugin SDK": ``TP_ERR_PLUGIN_LISTEN`` when the callback port is in use, not
    retried; the first plugin is not disturbed, and the port is free again after its stop()."""
    first = new_plugin(api.tp.url, role="default")
    first.tool(answers("first"), name="first_on_port")
    started = await first.start()
    port = int(started.url.rsplit(":", 1)[1])
    second = new_plugin(api.tp.url, role="default", port=port, start_timeout=30)
    second.tool(answers("second"), name="second_on_port")
    try:
        with pytest.raises(PluginError) as info:
            await asyncio.wait_for(second.start(), 10)
        assert info.value.code == "TP_ERR_PLUGIN_LISTEN", info.value
        assert not second.is_running
        assert (await api.call("first_on_port", {}))["output"] == "first"
    finally:
        await asyncio.gather(first.stop(grace=0), second.stop(grace=0))
    third = new_plugin(api.tp.url, role="default", port=port)
    third.tool(answers("third"), name="third_on_port")
    async with third:
        assert third.url == started.url
        assert (await api.call("third_on_port", {}))["output"] == "third"


# ---- lifecycle embedding ---------------------------------------------------------------------------


async def test_start_and_stop_in_an_aiohttp_application_s_hooks(api: Api) -> None:
    """README "Python plugin SDK": ``await plugin.start()`` … ``await plugin.stop()``, here from an
    aiohttp app's on_startup/on_cleanup and a cleanup_ctx (``async with``); the app's own route
    calls the tools through Toolport on the same event loop."""
    hooked = new_plugin(api.tp.url, role="default")
    hooked.tool(echo, name="hooked_echo")
    in_ctx = new_plugin(api.tp.url, role="default")
    in_ctx.tool(answers("from ctx"), name="ctx_tool")
    stopped: list[Any] = []

    async def on_startup(app: web.Application) -> None:
        await hooked.start()

    async def on_cleanup(app: web.Application) -> None:
        stopped.append(await hooked.stop())

    async def plugin_ctx(app: web.Application) -> Any:
        async with in_ctx:
            yield

    async def ask(request: web.Request) -> web.Response:
        first = await api.call("hooked_echo", {"text": request.query["q"]})
        second = await api.call("ctx_tool", {})
        return web.json_response([first["output"], second["output"]])

    app = web.Application()
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.cleanup_ctx.append(plugin_ctx)
    app.router.add_get("/ask", ask)
    runner, url = await serve_on_loopback(app)
    try:
        assert hooked.is_running and in_ctx.is_running
        async with api.session.get(url + "/ask", params={"q": "hi"}) as res:
            assert await res.json() == ["hi", "from ctx"]
    finally:
        await runner.cleanup()
    assert len(stopped) == 1 and stopped[0].is_cleared and stopped[0].removed == 1, stopped
    assert not hooked.is_running and not in_ctx.is_running
    names = await api.names()
    assert "hooked_echo" not in names and "ctx_tool" not in names


async def test_start_twice_at_once_and_a_plugin_reused_after_stop(api: Api) -> None:
    """README "Python plugin SDK" → Errors: ``TP_ERR_PLUGIN_STATE`` for start() twice or after
    stop() (TypeScript SDK: "A plugin starts once; create another to start again"); tools are
    declared before start(); stop() is idempotent and never raises."""
    plugin = new_plugin(api.tp.url, role="default")
    plugin.tool(echo, name="twice_echo")
    outcomes = await asyncio.gather(plugin.start(), plugin.start(), return_exceptions=True)
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(errors) == 1 and isinstance(errors[0], PluginError) and errors[0].code == "TP_ERR_PLUGIN_STATE", outcomes
    assert plugin.is_running and (await api.call("twice_echo", {"text": "a"}))["output"] == "a"
    with pytest.raises(PluginError) as late:
        plugin.tool(echo, name="late_tool")
    assert late.value.code == "TP_ERR_PLUGIN_STATE"
    first, again = await asyncio.gather(plugin.stop(), plugin.stop())
    assert first == again and first.is_cleared
    assert await plugin.stop() == first
    for reuse in (plugin.start, plugin.__aenter__):
        with pytest.raises(PluginError) as info:
            await reuse()
        assert info.value.code == "TP_ERR_PLUGIN_STATE"
    assert "twice_echo" not in await api.names()


async def test_run_inside_a_running_event_loop_raises_a_plugin_error_and_leaves_no_coroutine_behind(api: Api) -> None:
    """python/README.md: "Errors the SDK raises are PluginErrors"; ``run()`` runs its own loop, so
    inside one it must say so (TP_ERR_PLUGIN_STATE) without leaking a coroutine that was never
    awaited ("RuntimeWarning: coroutine 'Plugin._run_until_signal' was never awaited"). The plugin
    stays usable with ``async with``."""
    plugin = new_plugin(api.tp.url, role="default")
    plugin.tool(echo, name="in_loop_echo")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        raised: BaseException | None = None
        try:
            plugin.run()
        except BaseException as err:  # noqa: BLE001 - what it raises is the point
            raised = err
        if raised is not None:
            raised.__traceback__ = None  # its frames hold the coroutine run() made
        gc.collect()
    never_awaited = [str(w.message) for w in caught if "never awaited" in str(w.message)]
    async with plugin:
        assert (await api.call("in_loop_echo", {"text": "ok"}))["output"] == "ok"
    assert isinstance(raised, PluginError) and raised.code == "TP_ERR_PLUGIN_STATE", repr(raised)
    assert never_awaited == []


RUN_STOPPED_BY_ITS_TOOL = """
    import asyncio, sys
    from toolport_plugin import Plugin
    plugin = Plugin(sys.argv[1], toolport_url=sys.argv[2], role="default")
    pending = set()

    @plugin.tool
    async def shut_down() -> str:
        task = asyncio.get_running_loop().create_task(plugin.stop())
        pending.add(task)
        return "bye"

    plugin.on("registered", lambda event: print("READY", flush=True))
    plugin.run()
    print("RUN RETURNED", flush=True)
"""


async def test_run_returns_once_the_plugin_is_stopped_by_its_own_tool(api: Api, tmp_path: Path, children: list[Any]) -> None:
    """README "Python plugin SDK": ``run()`` "blocks until SIGINT/SIGTERM, then clears"; a plugin
    stopped otherwise (here a tool schedules ``plugin.stop()``: tools cleared, callback server
    closed) has nothing left to serve, and ``run()`` must return instead of blocking forever."""
    source = f"plugin:emb-run-{uuid.uuid4().hex[:8]}"
    proc = await spawn(children, tmp_path, RUN_STOPPED_BY_ITS_TOOL, source, api.tp.url)
    await read_until(proc.stdout, b"READY", [])
    assert (await api.call("shut_down", {}))["output"] == "bye"
    await eventually(lambda: _no_rows(api, source), "the stop's clear")
    rc, out, err = await finish(proc, 8)
    assert (rc, "RUN RETURNED" in out) == (0, True), f"run() still blocked 8 s after the plugin stopped; stderr: {err[-800:]}"


async def _no_rows(api: Api, source: str) -> None:
    assert await source_rows(api.session, api.tp, source) == []


SIGNAL_DURING_START = """
    import logging, sys
    from toolport_plugin import Plugin
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(name)s %(message)s")
    plugin = Plugin("emb-signal-at-start", toolport_url=sys.argv[1], start_timeout=float(sys.argv[2]), max_backoff=0.3)

    @plugin.tool
    async def echo(text: str) -> str:
        return text

    plugin.run()
    print("RUN RETURNED", flush=True)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT], ids=["SIGINT"])
async def test_a_signal_during_start_ends_run_without_waiting_for_start_timeout(tmp_path: Path, children: list[Any], sig: signal.Signals) -> None:
    """README "Python plugin SDK": ``run()`` serves "until SIGINT/SIGTERM"; ``start()`` retries
    for ``start_timeout`` while Toolport is unreachable. A signal during those retries (the user
    gave up waiting) must end ``run()`` like a signal after start: quietly, exit status 0. Here
    Toolport never comes, so the plugin would otherwise retry for all of ``start_timeout``."""
    tp = unstarted_toolport(["default"])  # nothing listens at its URL
    proc = await spawn(children, tmp_path, SIGNAL_DURING_START, tp.url, "5")
    seen: list[bytes] = []
    await read_until(proc.stderr, b"attempt 1 failed", seen)
    proc.send_signal(sig)
    rc, out, err = await finish(proc, 30)
    err = b"".join(seen).decode() + err
    attempts_after = err.split("attempt 1 failed", 1)[1].count("failed, retrying")
    assert (rc, "RUN RETURNED" in out) == (0, True), (
        f"exit status {rc} after {sig.name}; start() kept retrying ({attempts_after} more attempts) until "
        f"start_timeout: {err.strip().splitlines()[-1]}")


@pytest.mark.parametrize("release_after", [0.4, 1.6], ids=["finishes within grace", "would finish past grace"])
async def test_stop_lets_calls_in_flight_finish_for_grace_seconds_then_cancels_them(api: Api, release_after: float) -> None:
    """README "Python plugin SDK" → Start and stop: stop() "closes the server, letting calls in
    flight finish for ``grace`` seconds" (TypeScript SDK: "for graceMs … before their connections
    are closed (their handlers' signals abort)"). A call whose handler is released at 0.4 × grace
    answers; one released at 1.6 × grace is cancelled (``cancel_reason`` "disconnected") at the
    grace, never answered. Both release times are timers on the plugin's own loop, so the order
    is what counts, not the machine's speed."""
    grace = 1.0
    plugin = new_plugin(api.tp.url, role="default")
    started, release = asyncio.Event(), asyncio.Event()
    seen: dict[str, Any] = {}

    @plugin.tool(name="in_flight", timeout_seconds=60)
    async def in_flight(ctx: CallContext) -> str:
        started.set()
        try:
            await release.wait()
        except asyncio.CancelledError:
            seen["reason"] = ctx.cancel_reason
            raise
        seen["finished"] = True
        return "finished"

    await plugin.start()
    calling = asyncio.create_task(api.call("in_flight", {}))
    await asyncio.wait_for(started.wait(), 10)
    asyncio.get_running_loop().call_later(release_after * grace, release.set)
    stopped = await asyncio.wait_for(plugin.stop(grace=grace), 20)
    result = await asyncio.wait_for(calling, 20)
    assert stopped.is_cleared, stopped
    if release_after < 1:
        assert (result["is_error"], result.get("output"), seen) == (False, "finished", {"finished": True}), result
    else:
        assert (seen, result["is_error"]) == ({"reason": "disconnected"}, True), (
            f"stop(grace={grace}) let the handler run until it was released at {release_after} × grace: {result}")


# ---- a start() that does not finish leaves nothing registered ------------------------------------


class HoldingProxy:
    """A loopback HTTP server in front of the real Toolport (``toolport_url`` may carry any
    origin): it forwards every request, and holds Toolport's answer to the ``hold_at``-th
    registration (0-based) until ``release`` is set; ``landed`` says Toolport has taken it."""

    def __init__(self, tp: Toolport, hold_at: int) -> None:
        self.tp = tp
        self.hold_at = hold_at
        self.registers = 0
        self.landed = asyncio.Event()
        self.release = asyncio.Event()
        self.session = aiohttp.ClientSession()
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> HoldingProxy:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.forward)
        self.runner, self.url = await serve_on_loopback(app)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()
        assert self.runner is not None
        await self.runner.cleanup()
        await self.session.close()

    async def forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() in ("content-type", "accept", "authorization", "x-toolport-plugin-key")}
        async with self.session.request(request.method, self.tp.url + request.path_qs, data=body, headers=headers) as res:
            status, answer, content_type = res.status, await res.read(), res.headers.get("content-type", "application/json")
        if request.path == "/api/tools/register":
            index, self.registers = self.registers, self.registers + 1
            if index == self.hold_at:
                self.landed.set()
                await self.release.wait()
        return web.Response(status=status, body=answer, headers={"content-type": content_type})


async def _start_interrupted(tp: Toolport, tools: int, hold_at: int, how: str) -> None:
    async with HoldingProxy(tp, hold_at) as proxy, aiohttp.ClientSession() as session:
        options: dict[str, Any] = {"use_events": False, "poll_interval": 60, "role": "default"}
        if how == "request timeout":
            options.update(request_timeout=0.5, start_timeout=0)
        plugin = new_plugin(proxy.url, **options)
        for i in range(tools):
            plugin.tool(answers(f"tool {i}"), name=f"held_{i}")
        starting = asyncio.create_task(plugin.start())
        await asyncio.wait_for(proxy.landed.wait(), 10)
        if how == "cancelled":  # as asyncio.run() does to its main task on Ctrl-C
            starting.cancel()
        elif how == "stop()":
            stopping = asyncio.create_task(plugin.stop())
            await asyncio.sleep(0.05)
        else:
            await asyncio.wait({starting}, timeout=10)
        proxy.release.set()
        outcome: Any
        try:
            outcome = await asyncio.wait_for(starting, 10)
        except (asyncio.CancelledError, PluginError) as err:
            outcome = err
        if how == "stop()":
            await asyncio.wait_for(stopping, 10)
        if how == "cancelled":
            assert isinstance(outcome, asyncio.CancelledError), outcome
        else:
            assert isinstance(outcome, PluginError), outcome
        left = await source_rows(session, tp, plugin.source)
        if left:  # leave the shared Toolport as it was, whatever the verdict
            async with session.post(tp.url + "/api/tools/clear", json={"source": plugin.source}) as res:
                assert res.status == 200
        # Not even the registration whose answer never reached the plugin may stay behind.
        assert left == [], f"start() {how} while registration {hold_at} of {tools} was in flight left {left} registered"
        assert plugin.url == "" or await is_closed(plugin.url)


@examples(6)
@given(tools=st.integers(1, 3), data=st.data())
def test_a_start_that_does_not_finish_leaves_nothing_registered(toolport: Toolport, tools: int, data: st.DataObject) -> None:
    """plugin.py's start(): "On failure whatever was registered is cleared and the server closed"
    (TypeScript SDK README: "A failed start() clears what it registered"): whether start() is
    cancelled (Ctrl-C under asyncio.run, a wait_for timeout), stop() comes meanwhile, or a
    registration's answer times out — at whichever registration that happens."""
    hold_at = data.draw(st.integers(0, tools - 1), "hold_at")
    how = data.draw(st.sampled_from(["cancelled", "stop()", "request timeout"]), "how")
    asyncio.run(asyncio.wait_for(_start_interrupted(toolport, tools, hold_at, how), 40))


@pytest.mark.parametrize("how", ["cancelled", "request timeout"])
def test_regression_a_start_interrupted_during_its_first_registration_clears_it(toolport: Toolport, how: str) -> None:
    """The shrunk case of the property above: the first registration reached Toolport, but its
    answer did not reach the plugin; start()'s clean-up skips the clear (nothing "succeeded")."""
    asyncio.run(asyncio.wait_for(_start_interrupted(toolport, 1, 0, how), 40))


# ---- handlers --------------------------------------------------------------------------------------


CALL_TAG: contextvars.ContextVar[str] = contextvars.ContextVar("CALL_TAG", default="unset")


async def _read_tag_later() -> str:
    await asyncio.sleep(0.01)
    return CALL_TAG.get()


@examples(4)
@given(kinds=st.lists(st.sampled_from(["async", "sync", "spawns"]), min_size=1, max_size=6))
def test_each_call_runs_in_its_own_context(toolport: Toolport, kinds: list[str]) -> None:
    """README "Python plugin SDK" → Sync or async handlers: an ``async def`` runs on the plugin's
    event loop (as a task of its own: ``asyncio.current_task()``), a plain ``def`` in a worker
    thread with the context variables copied (asyncio.to_thread). Concurrent calls never see each
    other's context variables; a task a handler spawns inherits its call's context."""
    async def go() -> None:
        loop_thread = threading.get_ident()
        CALL_TAG.set("set before start()")
        plugin = new_plugin(toolport.url, role="default")
        children: list[asyncio.Task[str]] = []

        @plugin.tool(name="ctx_async")
        async def ctx_async(tag: str) -> dict[str, Any]:
            before = CALL_TAG.get()
            CALL_TAG.set(tag)
            await asyncio.sleep(0.01)  # let the other calls run meanwhile
            task = asyncio.current_task()
            return {"before": before, "after": CALL_TAG.get(), "task": id(task) if task else None,
                    "on_loop": threading.get_ident() == loop_thread}

        @plugin.tool(name="ctx_sync")
        def ctx_sync(tag: str) -> dict[str, Any]:
            before = CALL_TAG.get()
            CALL_TAG.set(tag)
            threading.Event().wait(0.01)
            return {"before": before, "after": CALL_TAG.get(), "task": None, "on_loop": threading.get_ident() == loop_thread}

        @plugin.tool(name="ctx_spawns")
        async def ctx_spawns(tag: str) -> dict[str, Any]:
            before = CALL_TAG.get()
            CALL_TAG.set(tag)
            child = asyncio.create_task(_read_tag_later())
            children.append(child)
            return {"before": before, "after": await child, "task": id(asyncio.current_task()), "on_loop": True}

        async with plugin, aiohttp.ClientSession() as session:
            CALL_TAG.set("set after start()")
            tags = [f"{kind}-{i}" for i, kind in enumerate(kinds)]
            results = await asyncio.gather(*(call(session, toolport, f"ctx_{kind}", {"tag": tag}) for kind, tag in zip(kinds, tags)))
            tasks = set()
            for kind, tag, result in zip(kinds, tags, results):
                assert result["is_error"] is False, result
                out = result["output"]
                assert (out["before"], out["after"]) == ("set before start()", tag), (kind, out)
                assert out["on_loop"] is (kind != "sync"), (kind, out)
                if kind != "sync":
                    assert out["task"] is not None and out["task"] not in tasks, (kind, out)
                    tasks.add(out["task"])
        assert all(child.done() for child in children)
    asyncio.run(asyncio.wait_for(go(), 60))


async def test_a_deadline_while_awaiting_shielded_work_answers_at_the_deadline_and_the_work_goes_on(
        api: Api, caplog: pytest.LogCaptureFixture) -> None:
    """README "Python plugin SDK" → Deadline and cancellation: at the deadline (or when Toolport
    hangs up) the async handler's task is cancelled and ``ctx.cancel_reason`` says which; work it
    shielded runs on,
    and its failure is not reported as "exception was never retrieved"."""
    caplog.set_level(logging.DEBUG)
    plugin = new_plugin(api.tp.url, role="default")
    seen: dict[str, Any] = {}
    work_done = asyncio.Event()

    async def shielded_work() -> str:
        await asyncio.sleep(0.6)
        work_done.set()
        raise RuntimeError("the shielded work failed later")

    @plugin.tool(name="shielded", timeout_seconds=0.3)
    async def shielded(ctx: CallContext) -> str:
        work = asyncio.ensure_future(shielded_work())
        seen["work"] = work
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            seen["reason"] = ctx.cancel_reason
            seen["is_set"] = ctx.cancelled.is_set()
            raise

    async with plugin:
        result = await api.call("shielded", {})
        assert result["is_error"] is True, result
        # Toolport's own timeout is the same 0.3 s: whichever fires first, the SDK's deadline or
        # Toolport hanging up, cancels the handler.
        await eventually(lambda: _has_key(seen, "reason"), "the handler cancelled")
        assert seen["reason"] in ("deadline", "disconnected") and seen["is_set"] is True, seen
        await asyncio.wait_for(work_done.wait(), 10)
        assert isinstance(seen["work"].exception(), RuntimeError)
        assert (await api.call("shielded", {}))["is_error"] is True  # the plugin answers on
        gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()], caplog.text


async def _has_key(seen: dict[str, Any], key: str) -> None:
    assert key in seen, seen


class AsyncCallable:
    """A tool as an object: one instance per configured resource."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    async def __call__(self, text: str) -> str:
        return self.prefix + text


class SyncCallable:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def __call__(self, text: str) -> str:
        return self.prefix + text


@pytest.mark.parametrize("make", [lambda: AsyncCallable("async:"), lambda: SyncCallable("sync:")], ids=["async __call__", "sync __call__"])
async def test_a_callable_object_can_be_a_tool(api: Api, make: Callable[[], Any]) -> None:
    """README "Python plugin SDK": parameters come from the type hints, and only "a signature
    that cannot be a tool" is refused; the SDK itself runs an object whose ``__call__`` is a
    coroutine function on the loop (_tool.py Tool.is_async). An instance with a typed
    ``__call__`` is such a tool; it was refused: "cannot resolve its type hints"."""
    tool = make()
    plugin = new_plugin(api.tp.url, role="default")
    try:
        plugin.tool(tool, name=f"object_{type(tool).__name__}")
    except PluginError as err:
        pytest.fail(f"declaring a callable {type(tool).__name__} instance: {err}")
    async with plugin:
        result = await api.call(f"object_{type(tool).__name__}", {"text": "x"})
        assert (result["is_error"], result["output"]) == (False, tool.prefix + "x"), result


async def _later(value: str) -> str:
    await asyncio.sleep(0.01)
    return value


@pytest.mark.parametrize("kind", ["lambda returning a coroutine", "async def returning a coroutine"])
async def test_a_handler_whose_result_is_an_awaitable_answers_with_what_it_resolves_to(api: Api, kind: str) -> None:
    """README "Python plugin SDK": it "does the same as the TypeScript SDK", whose handler result
    is awaited whatever returns it (``handler: (args) => fetchWeather(args)`` is idiomatic there).
    A plain function (a lambda, a sync decorator's wrapper) that returns a coroutine ran in a
    worker thread; its coroutine was never awaited: an error result plus a RuntimeWarning."""
    plugin = new_plugin(api.tp.url, role="default")
    if kind.startswith("lambda"):
        plugin.tool(lambda city: _later(f"weather in {city}"), name="awaitable_result", parameters={
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
    else:
        async def forgets_await(city: str) -> Any:
            return _later(f"weather in {city}")
        plugin.tool(forgets_await, name="awaitable_result")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with plugin:
            result = await api.call("awaitable_result", {"city": "Oslo"})
        gc.collect()
    never_awaited = [str(w.message) for w in caught if "never awaited" in str(w.message)]
    assert (result["is_error"], result.get("output")) == (False, "weather in Oslo"), (result, never_awaited)
    assert never_awaited == []


async def _fill_default_executor(api: Api, size: int, release: threading.Event) -> tuple[Plugin, list[asyncio.Task[dict[str, Any]]]]:
    """Starts a plugin whose sync tool blocks until ``release``, and ``size`` calls of it."""
    running: list[int] = []
    blocker = new_plugin(api.tp.url, role="default")

    @blocker.tool(name="blocks", timeout_seconds=60)
    def blocks() -> str:
        running.append(1)
        release.wait(30)
        return "released"

    await blocker.start()
    calls = [asyncio.create_task(api.call("blocks", {})) for _ in range(size)]
    await eventually(_at_least(running, size), f"{size} sync calls running")
    return blocker, calls


def _at_least(items: list[int], n: int) -> Callable[[], Awaitable[None]]:
    async def check() -> None:
        assert len(items) >= n, len(items)
    return check


def _default_executor_size() -> int:
    loop = asyncio.get_running_loop()
    executor = getattr(loop, "_default_executor", None)
    return executor._max_workers if executor is not None else min(32, (os.cpu_count() or 1) + 4)


async def test_blocking_sync_handlers_do_not_stop_the_loop_other_calls_or_the_watch(api: Api) -> None:
    """README "Python plugin SDK": a plain ``def`` runs in a worker thread. With every worker
    blocked, async tools still answer, and an unregistered tool is registered again (the event
    stream and the checks run on the loop)."""
    await asyncio.to_thread(lambda: None)  # the loop's default executor exists from here on
    size = _default_executor_size()
    release = threading.Event()
    blocker, calls = await _fill_default_executor(api, size, release)
    other = new_plugin(api.tp.url, role="default")
    other.tool(echo, name="still_answers")
    try:
        async with other:
            await eventually(lambda: _watching(other), "the event stream followed")
            assert (await api.call("still_answers", {"text": "yes"}))["output"] == "yes"
            status, _ = await api.post("/api/tools/unregister", {"name": "still_answers", "role": "default"})
            assert status == 200
            await eventually(lambda: _listed(api, "still_answers"), "still_answers registered again")
            assert (await api.call("still_answers", {"text": "again"}))["output"] == "again"
    finally:
        release.set()
        outputs = [r["output"] for r in await asyncio.gather(*calls)]
        await blocker.stop()
    assert outputs == ["released"] * size


async def _watching(plugin: Plugin) -> None:
    assert plugin.watch_mode == "events"


async def _listed(api: Api, name: str) -> None:
    assert name in await api.names()


async def test_blocking_sync_handlers_do_not_starve_the_sdk_s_own_requests_to_toolport(api: Api) -> None:
    """README "Python plugin SDK": ``toolport_url`` is any loopback URL (``localhost`` included),
    and ``start()`` "returns once every tool is registered". The SDK runs sync handlers on the
    event loop's *default* executor (asyncio.to_thread), the very pool aiohttp resolves a host
    name in: while sync tools of a plugin in the process hold every worker (each within its
    ``timeout_seconds``), another plugin's start() cannot even resolve ``localhost``."""
    by_name = api.tp.url.replace("127.0.0.1", "localhost")
    control = new_plugin(by_name, role="default", start_timeout=0, request_timeout=3)
    control.tool(answers("by name"), name="control_by_name")
    async with control:  # localhost reaches this Toolport
        assert (await api.call("control_by_name", {}))["output"] == "by name"
    await asyncio.to_thread(lambda: None)
    release = threading.Event()
    blocker, calls = await _fill_default_executor(api, _default_executor_size(), release)
    late = new_plugin(by_name, role="default", start_timeout=0, request_timeout=3)
    late.tool(answers("late"), name="late_by_name")
    try:
        try:
            await late.start()
        except PluginError as err:
            pytest.fail(f"start() while sync handlers of another plugin run: {err}")
        assert (await api.call("late_by_name", {}))["output"] == "late"
    finally:
        await late.stop(grace=0)
        release.set()
        await asyncio.gather(*calls)
        await blocker.stop()


# ---- logging ----------------------------------------------------------------------------------------


async def test_logs_name_the_sdk_s_logger_say_nothing_at_warning_in_a_normal_life_and_carry_no_call_data(
        api: Api, caplog: pytest.LogCaptureFixture) -> None:
    """README "Python plugin SDK": ``logger`` defaults to ``logging.getLogger("toolport_plugin")``;
    "arguments and outputs are never logged"; an exception's "type and traceback frames, not its
    message, are logged at debug level". Checked at DEBUG over every logger: no record's message,
    arguments, extra fields or exception text holds an argument, an output, an error message, the
    token, the plugin key or the callback URLs' secret segment; nothing at WARNING or above."""
    caplog.set_level(logging.DEBUG)
    secret = f"SECRET-{uuid.uuid4().hex}"
    token = f"tok-{uuid.uuid4().hex}{uuid.uuid4().hex}"
    plugin = new_plugin(api.tp.url, role="default", token=token)

    @plugin.tool(name="log_echo")
    async def log_echo(text: str) -> dict[str, str]:
        return {"echo": text}

    @plugin.tool(name="log_raises")
    async def log_raises(text: str) -> str:
        raise ValueError(f"bad {text}")

    @plugin.tool(name="log_sync_raises")
    def log_sync_raises(text: str) -> str:
        raise RuntimeError(f"bad {text}")

    @plugin.tool(name="log_tool_error")
    async def log_tool_error(text: str) -> str:
        raise ToolError(f"no {text}", output={"q": text})

    @plugin.tool(name="log_typed")
    async def log_typed(n: int) -> int:
        return n

    @plugin.tool(name="log_late", timeout_seconds=0.2)
    async def log_late(text: str) -> str:
        await asyncio.sleep(5)
        return text

    async with plugin:
        for name in ("log_echo", "log_raises", "log_sync_raises", "log_tool_error", "log_late"):
            result = await api.call(name, {"text": secret})
            assert secret in result["text"] or name == "log_late", result
        result = await api.call("log_typed", {"n": secret})
        assert result["is_error"] is True, result
        prefix = plugin.callback_url("log_echo").split("/")[3]
    forbidden = {"argument": secret, "token": token, "plugin key": plugin.plugin_key, "callback secret": prefix}
    formatter = logging.Formatter()
    for record in caplog.records:
        texts = [record.getMessage(), repr(record.args), *(repr(v) for k, v in vars(record).items() if k not in ("msg", "args"))]
        if record.exc_info:
            texts.append(formatter.formatException(record.exc_info))
        for what, value in forbidden.items():
            assert not any(value in text for text in texts), f"the {what} is in a log record of {record.name}: {record.getMessage()!r}"
    loud = [(r.name, r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING]
    assert loud == []
    ours = {r.name for r in caplog.records if r.name.startswith("toolport")}
    assert ours == {"toolport_plugin"}, ours


# ---- whole programs under PYTHONDEVMODE --------------------------------------------------------------


DEVMODE_PROGRAM = """
    import asyncio, sys
    from toolport_plugin import CallContext, Plugin
    mode, url = sys.argv[1], sys.argv[2]
    plugin = Plugin(f"emb-devmode-{mode}", toolport_url=url, role="default", poll_interval=0.3)

    @plugin.tool(name=f"{mode}_async")
    async def echo_async(text: str) -> str:
        return text

    @plugin.tool(name=f"{mode}_sync")
    def echo_sync(text: str) -> str:
        return text

    @plugin.tool(name=f"{mode}_late", timeout_seconds=0.2)
    async def late(ctx: CallContext) -> str:
        await asyncio.sleep(5)
        return "never"

    @plugin.tool(name=f"{mode}_late_sync", timeout_seconds=0.2)
    def late_sync(ctx: CallContext) -> str:
        ctx.cancelled.wait(5)
        return "never"

    plugin.on("registered", lambda event: print("READY", flush=True))
    if mode == "run":
        plugin.run()
    else:
        async def main() -> None:
            async with plugin:
                await asyncio.Event().wait()
        try:
            asyncio.run(main())
        except KeyboardInterrupt:
            print("INTERRUPTED", flush=True)
    print("END", flush=True)
"""


async def _devmode_life(api: Api, tmp_path: Path, children: list[Any], mode: str, sig: signal.Signals) -> tuple[int | None, str, str]:
    proc = await spawn(children, tmp_path, DEVMODE_PROGRAM, mode, api.tp.url, PYTHONDEVMODE="1",
                       PYTHONWARNINGS="error::ResourceWarning,always::RuntimeWarning", PYTHONASYNCIODEBUG="1")
    await read_until(proc.stdout, b"READY", [])
    for name, args in ((f"{mode}_async", {"text": "a"}), (f"{mode}_sync", {"text": "s"}), (f"{mode}_late", {}), (f"{mode}_late_sync", {})):
        result = await api.call(name, args)
        assert result["is_error"] is name.endswith(("late", "late_sync")), result
    proc.send_signal(sig)
    return await finish(proc, 20)


async def test_run_and_asyncio_run_end_cleanly_on_a_signal_under_devmode(api: Api, tmp_path: Path, children: list[Any]) -> None:
    """README "Python plugin SDK": ``run()`` stops on SIGTERM, ``async with`` when its block ends
    (here: Ctrl-C cancels ``asyncio.run``'s main task). Under PYTHONDEVMODE (asyncio debug) with
    ResourceWarnings as errors, after sync, async and past-deadline calls: exit status 0, the
    tools cleared, and no unclosed session/transport, pending task or never-awaited coroutine."""
    lives = await asyncio.gather(_devmode_life(api, tmp_path, children, "run", signal.SIGTERM),
                                 _devmode_life(api, tmp_path, children, "asyncio", signal.SIGINT))
    for mode, (rc, out, err) in zip(("run", "asyncio"), lives):
        assert rc == 0 and out.strip().endswith("END"), (mode, rc, out, err)
        for bad in ("ResourceWarning", "Unclosed", "unclosed", "Task was destroyed", "never awaited", "Traceback", "Exception ignored"):
            assert bad not in err, (mode, err)
    for mode in ("run", "asyncio"):
        assert await source_rows(api.session, api.tp, f"plugin:emb-devmode-{mode}") == []
