"""The watcher's event-stream path, against a stand-in that speaks the documented contract.

Toolport's ``GET /api/events`` (``hello`` with ``instance_id``, ``evicted`` with ``origin`` and
``tools``) is built in parallel with this SDK; until a Toolport in this checkout serves it, this
stand-in (the four routes the plugin uses, nothing else) exercises the SDK's side: reconnecting
when the stream ends, repairing after a new ``instance_id``, and reacting to an eviction of its
own origin only. test_lifecycle.py has the same scenario against the real Toolport, and runs it
as soon as that Toolport serves the stream.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

from toolport_plugin import Plugin

from .conftest import serve_on_loopback


class StandIn:
    def __init__(self) -> None:
        self.tools: list[dict[str, Any]] = []
        self.instance = "A"
        self.registrations = 0
        self.queue: asyncio.Queue[str | None] | None = None
        self.types: list[str] = []
        self.url = ""
        self.rejects_filter = False
        #: Answer every stream request 503 TP_ERR_STREAM_FULL (all subscriber slots taken).
        self.stream_full = False
        self.lists = 0

    async def events(self, request: web.Request) -> web.StreamResponse:
        if self.rejects_filter and "types" in request.query:
            return web.json_response({"ok": False, "code": "TP_ERR_VALIDATION"}, status=422)
        if self.stream_full:
            return web.json_response({"ok": False, "code": "TP_ERR_STREAM_FULL"}, status=503)
        self.types = request.query.get("types", "").split(",")
        res = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await res.prepare(request)
        await res.write(f"event: hello\ndata: {json.dumps({'instance_id': self.instance})}\n\n".encode())
        queue: asyncio.Queue[str | None] = asyncio.Queue()
        self.queue = queue
        while (item := await queue.get()) is not None:
            await res.write(item.encode())
        assert request.transport is not None
        request.transport.close()  # as a killed Toolport would: the stream just ends
        return res

    async def list_tools(self, request: web.Request) -> web.Response:
        self.lists += 1
        return web.json_response({"ok": True, "tools_by_role": {"default": self.tools}})

    async def register(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.registrations += 1
        self.tools = [t for t in self.tools if t["name"] != body["name"]]
        self.tools.append({"name": body["name"], "source": body["source"], "callback_url": body["callback_url"]})
        return web.json_response({"ok": True, "registered": body["name"], "affected_roles": ["default"], "failed_roles": []})

    async def clear(self, request: web.Request) -> web.Response:
        removed, self.tools = len(self.tools), []
        return web.json_response({"ok": True, "removed": removed, "affected_roles": ["default"], "failed_roles": []})


@pytest.fixture
async def stand_in() -> AsyncIterator[StandIn]:
    server = StandIn()
    app = web.Application()
    app.router.add_get("/api/events", server.events)
    app.router.add_get("/api/tools", server.list_tools)
    app.router.add_post("/api/tools/register", server.register)
    app.router.add_post("/api/tools/clear", server.clear)
    runner, server.url = await serve_on_loopback(app)
    yield server
    if server.queue is not None:
        await server.queue.put(None)
    await runner.cleanup()


async def until(predicate: Callable[[], bool], what: str, timeout: float = 10) -> None:
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout, f"{what} not reached within {timeout} s"
        await asyncio.sleep(0.02)


def echo_plugin(stand_in: StandIn, source: str, **options: Any) -> Plugin:
    """A plugin of the stand-in with one tool, `echo`; checks only on events unless told otherwise."""
    options = {"poll_interval": 60, "resync_interval": 60, **options}
    plugin = Plugin(source, toolport_url=stand_in.url, **options)

    @plugin.tool
    async def echo(text: str) -> str:
        return text

    return plugin


async def lists_once_following(stand_in: StandIn, plugin: Plugin) -> tuple[asyncio.Queue[str | None], int]:
    """Once `plugin` follows the stand-in's stream and its connection's own check is done: the
    stream's queue, and how many times the registry was listed so far."""
    await until(lambda: plugin.watch_mode == "events" and stand_in.queue is not None, "the stream followed")
    await asyncio.sleep(0.3)  # the connection's own check
    assert stand_in.queue is not None
    return stand_in.queue, stand_in.lists


async def test_the_event_stream_repairs_a_restart_and_an_eviction_without_polling(stand_in: StandIn) -> None:
    # Checks every 60 s at most: only the stream can bring the tools back in time.
    plugin = Plugin("events", toolport_url=stand_in.url, poll_interval=60, resync_interval=60)

    @plugin.tool
    async def echo(text: str) -> str:
        return text

    async with plugin:
        await until(lambda: plugin.watch_mode == "events", "the stream followed")
        assert {"evicted", "unregistered", "cleared", "role-added"} <= set(stand_in.types)

        # A restart: the registry is empty, the stream ends, the next hello names a new instance.
        first = stand_in.queue
        assert first is not None
        stand_in.tools, stand_in.instance = [], "B"
        await first.put(None)
        await until(lambda: [t["name"] for t in stand_in.tools] == ["echo"], "echo registered again after the restart")
        await until(lambda: stand_in.queue is not first and plugin.watch_mode == "events", "the stream followed again")
        assert plugin._watch.instance_id == "B"

        # An eviction of this plugin's origin (a comment line and a two-line data field on the way).
        assert stand_in.queue is not None
        stand_in.tools = []
        await stand_in.queue.put(": keep-alive\n\n")
        evicted = {"origin": plugin.url, "tools": [{"role": "default", "name": "echo"}], "roles": ["default"]}
        await stand_in.queue.put(f"event: evicted\ndata: {json.dumps(evicted)}\n\n")
        await until(lambda: [t["name"] for t in stand_in.tools] == ["echo"], "echo registered again after the eviction")

        # Another origin's eviction is none of this plugin's business.
        before = stand_in.registrations
        await stand_in.queue.put('event: evicted\ndata: {"origin": "http://127.0.0.1:1",\ndata: "tools": [], "roles": []}\n\n')
        await asyncio.sleep(0.3)
        assert stand_in.registrations == before
    assert stand_in.tools == []  # the clean stop cleared the source



async def test_a_stream_that_refuses_the_filter_is_followed_unfiltered(stand_in: StandIn) -> None:
    stand_in.rejects_filter = True
    plugin = echo_plugin(stand_in, "unfiltered")
    async with plugin:
        await until(lambda: plugin.watch_mode == "events", "the stream followed")
        assert stand_in.types == [""]


async def test_unfiltered_events_that_do_not_name_the_plugin_run_no_check(stand_in: StandIn) -> None:
    """README "Python plugin SDK" → Keeping registrations alive: `unregistered` and `cleared` of its
    origin or source run a check (as in the TypeScript SDK). Without the filter every event comes:
    a busy Toolport's hundreds of `call` events a second must not each list the registry."""
    stand_in.rejects_filter = True
    plugin = echo_plugin(stand_in, "quiet")
    async with plugin:
        queue, before = await lists_once_following(stand_in, plugin)
        other = {"origin": "http://127.0.0.1:1", "source": "plugin:other", "tools": [{"role": "default", "name": "x"}],
                 "roles": ["default"]}
        for i in range(100):
            call = {"role": "default", "tool": "x", "source": "plugin:other", "outcome": "ok", "is_error": False,
                    "duration_ms": 1, "bytes": 2}
            await queue.put(f"event: call\ndata: {json.dumps(call)}\n\n")
        for kind in ("registered", "unregistered", "cleared"):
            await queue.put(f"event: {kind}\ndata: {json.dumps(other)}\n\n")
        await queue.put("event: sync\ndata: {\"role\": \"default\", \"ok\": true}\n\n")
        await asyncio.sleep(0.5)
        assert stand_in.lists == before, f"{stand_in.lists - before} checks for events about others"
        # One that names its source runs a check.
        ours = {**other, "source": plugin.source}
        await queue.put(f"event: unregistered\ndata: {json.dumps(ours)}\n\n")
        await until(lambda: stand_in.lists == before + 1, "a check for its own source's unregister")


async def test_with_the_stream_refused_it_checks_every_poll_interval(stand_in: StandIn) -> None:
    """README "Python plugin SDK": "Without the stream it checks every `poll_interval`", also when
    the stream is refused with an answer worth retrying (503 TP_ERR_STREAM_FULL), as the TypeScript
    SDK does: not every `resync_interval`."""
    stand_in.stream_full = True
    plugin = echo_plugin(stand_in, "polled", poll_interval=0.3)
    async with plugin:
        assert plugin.watch_mode == "polling"
        before = stand_in.registrations
        stand_in.tools = []  # someone unregistered it
        await until(lambda: stand_in.registrations > before, "registered again by a poll", timeout=5)


async def test_role_added_checks_for_a_plugin_of_every_role_or_for_its_own_role_only(stand_in: StandIn) -> None:
    """README "Python plugin SDK" → Keeping registrations alive: `role-added` runs a check where the
    new role can lack the plugin's tools; a one-role plugin does not list the registry for every
    role made per conversation."""
    one = echo_plugin(stand_in, "one-role", role="default")
    async with one:
        queue, before = await lists_once_following(stand_in, one)
        for i in range(20):
            await queue.put(f"event: role-added\ndata: {json.dumps({'role': f'conversation-{i}'})}\n\n")
        await asyncio.sleep(0.5)
        assert stand_in.lists == before, f"{stand_in.lists - before} checks for other roles"
        await queue.put(f"event: role-added\ndata: {json.dumps({'role': 'default'})}\n\n")
        await until(lambda: stand_in.lists == before + 1, "a check for its own role added back")
