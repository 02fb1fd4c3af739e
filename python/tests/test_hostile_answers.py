"""The client's reading of answers and events it did not expect, against a stand-in Toolport.

README "Python plugin SDK": an answer is read whole, however it is cut into pieces, up to a cap;
odd fields are a documented ``PluginError`` (never a ``TypeError``); the event stream's reconnection
backs off until a ``hello`` shows the stream is up, one event is not buffered without bound, and
neither an odd event nor an odd list answer stops the watching.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from toolport_plugin import Plugin, PluginError, _client, errors

from .conftest import serve_on_loopback

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Fake:
    """The four routes the plugin uses; each one replaceable by a test."""

    def __init__(self) -> None:
        self.url = ""
        self.counts: dict[str, int] = {}
        self.routes: dict[str, Handler] = {}
        self.hung_up = asyncio.Event()

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        name = request.path.lstrip("/")
        self.counts[name] = self.counts.get(name, 0) + 1
        handler = self.routes.get(name)
        if handler is not None:
            return await handler(request)
        if name == "api/tools/register":
            body = await request.json()
            return web.json_response({"ok": True, "registered": body["name"], "affected_roles": ["default"], "failed_roles": []})
        if name == "api/tools/clear":
            return web.json_response({"ok": True, "removed": 1})
        if name == "api/tools":
            return web.json_response({"ok": True, "tools_by_role": {"default": []}})
        return web.json_response({"ok": False, "code": "TP_ERR_NOT_FOUND"}, status=404)

    def count(self, name: str) -> int:
        return self.counts.get(name, 0)


@pytest.fixture
async def fake() -> AsyncIterator[Fake]:
    server = Fake()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.dispatch)
    runner, server.url = await serve_on_loopback(app)
    yield server
    await runner.cleanup()


def new_plugin(fake: Fake, **options: Any) -> Plugin:
    plugin = Plugin("hostile", toolport_url=fake.url, **{"poll_interval": 60.0, "resync_interval": 60.0,
                                                          "start_timeout": 0, **options})

    @plugin.tool
    async def probe(x: str = "") -> str:
        return x

    return plugin


async def until(predicate: Callable[[], bool], what: str, timeout: float = 10) -> None:
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout, f"{what} not reached within {timeout} s"
        await asyncio.sleep(0.02)


async def stream(request: web.Request) -> web.StreamResponse:
    res = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await res.prepare(request)
    return res


async def test_an_answer_in_several_pieces_is_read_whole(fake: Fake) -> None:
    async def in_pieces(request: web.Request) -> web.StreamResponse:
        body = json.dumps({"ok": True, "registered": "probe", "affected_roles": ["default"], "failed_roles": []}).encode()
        res = web.StreamResponse(headers={"content-type": "application/json"})
        await res.prepare(request)
        await res.write(body[:10])
        await asyncio.sleep(0.03)
        await res.write(body[10:])
        await res.write_eof()
        return res

    fake.routes["api/tools/register"] = in_pieces
    async with new_plugin(fake) as plugin:
        assert plugin.is_running


async def test_odd_fields_in_a_registration_answer_are_treated_as_absent(fake: Fake) -> None:
    async def odd(request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "failed_roles": 5, "affected_roles": 7})

    fake.routes["api/tools/register"] = odd
    async with new_plugin(fake) as plugin:
        assert plugin.is_running


async def test_an_answer_past_the_cap_is_refused(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_client, "_MAX_ANSWER_BYTES", 1000)

    async def large(request: web.Request) -> web.StreamResponse:
        res = web.StreamResponse(headers={"content-type": "application/json"})  # chunked: no length
        await res.prepare(request)
        for _ in range(10):
            await res.write(b" " * 500)
        await res.write(b'{"ok": true}')
        await res.write_eof()
        return res

    fake.routes["api/tools/register"] = large
    with pytest.raises(PluginError) as raised:
        await new_plugin(fake, start_timeout=3).start()
    assert raised.value.code == errors.REFUSED
    # With its status, as the TypeScript SDK's: start() does not retry it until start_timeout.
    assert raised.value.status == 200
    assert fake.count("api/tools/register") == 1


async def test_a_stream_without_hello_is_reconnected_with_backoff(fake: Fake) -> None:
    async def bogus(request: web.Request) -> web.StreamResponse:
        res = await stream(request)
        await res.write(b"retry: 0\n\nevent: bogus\ndata: {}\n\n")
        await res.write_eof()
        return res

    fake.routes["api/events"] = bogus
    async with new_plugin(fake, use_events=True):
        await asyncio.sleep(3)
        # Backoff from 0.25-0.5 s, doubling: at most 5 attempts in 3 s (a fixed 0.25 s would make 12).
        assert fake.count("api/events") <= 5


async def test_a_refused_stream_is_retried_not_given_up(fake: Fake) -> None:
    async def too_many(request: web.Request) -> web.Response:
        return web.Response(status=429, headers={"retry-after": "0"})

    fake.routes["api/events"] = too_many
    async with new_plugin(fake, use_events=True, max_backoff=0.5) as plugin:
        await until(lambda: fake.count("api/events") >= 3, "the stream asked for again")
        assert plugin._watch.use_events  # still meaning to follow it, not polling for good


async def test_one_endless_event_is_not_buffered(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_client, "_MAX_EVENT_BYTES", 64 * 1024)
    written = 0

    async def endless(request: web.Request) -> web.StreamResponse:
        nonlocal written
        res = await stream(request)
        await res.write(b'event: hello\ndata: {"instance_id": "A"}\n\n')
        if fake.count("api/events") > 1:
            await asyncio.sleep(60)  # a reconnection: open and quiet
            return res
        await res.write(b"event: unregistered\n")
        try:
            while written < 8 * 1024 * 1024:
                await res.write(b"data: " + b"a" * 1000 + b"\n")
                written += 1007
        except (ConnectionError, RuntimeError):
            pass
        finally:  # the client hung up: a failed write, or this handler cancelled
            if written < 8 * 1024 * 1024:
                fake.hung_up.set()
        return res

    fake.routes["api/events"] = endless
    async with new_plugin(fake, use_events=True):
        await asyncio.wait_for(fake.hung_up.wait(), 20)
    assert written < 8 * 1024 * 1024


async def test_an_unhashable_name_in_an_event_does_not_stop_the_follower(fake: Fake) -> None:
    queue: asyncio.Queue[bytes] = asyncio.Queue()

    async def follow(request: web.Request) -> web.StreamResponse:
        res = await stream(request)
        await res.write(b'event: hello\ndata: {"instance_id": "A"}\n\n')
        while True:
            await res.write(await queue.get())

    fake.routes["api/events"] = follow
    async with new_plugin(fake, use_events=True) as plugin:
        await until(lambda: plugin.watch_mode == "events" and fake.count("api/tools") >= 1, "the first check")
        await queue.put(b'event: evicted\ndata: {"tools":[{"name":[1]}],"origin":[]}\n\n')
        await asyncio.sleep(0.2)
        before = fake.count("api/tools")
        await queue.put(b'event: unregistered\ndata: {"source":"plugin:hostile"}\n\n')
        await until(lambda: fake.count("api/tools") > before, "a check after the unregistered event", 4)
        assert plugin._watch.follower is not None and not plugin._watch.follower.done()


async def test_a_list_answer_with_an_unhashable_name_is_a_failed_check(fake: Fake) -> None:
    async def odd(request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "tools_by_role": {"default": [{"name": [1]}, {"name": {}}]}})

    fake.routes["api/tools"] = odd
    plugin = new_plugin(fake, poll_interval=0.1, max_backoff=0.2)
    codes: list[str] = []
    plugin.on("error", lambda err: codes.append(err.code))
    async with plugin:
        await until(lambda: fake.count("api/tools") >= 4 and fake.count("api/tools/register") >= 3,
                    "the checks go on (the nameless rows do not hold probe)")
    assert all(code == errors.REFUSED for code in codes)


_NOT_SYNCED = {"ok": False, "registered": "probe", "affected_roles": [],
               "failed_roles": [{"role": "default", "error": "session refused"}],
               "error": "no role accepted the registration"}
_NO_ROLES = {"ok": False, "registered": "probe", "error": "no roles exist", "affected_roles": [], "failed_roles": []}
_EVERY_ROLE_REFUSED = {"ok": False, "registered": "probe", "error": "no role accepted the registration",
                       "affected_roles": [], "failed_roles": [
                           {"role": "default", "error": "'probe' belongs to source 'plugin:other'", "owned_by": "plugin:other"}]}
_INVALID = {"ok": False, "statusCode": 422, "code": "TP_ERR_VALIDATION", "error": "Unprocessable Entity", "message": "bad"}


@pytest.mark.parametrize(("answer", "status", "clears"), [
    (_NOT_SYNCED, 200, 1),
    (_NO_ROLES, 200, 0),
    (_EVERY_ROLE_REFUSED, 200, 0),
    (_INVALID, 422, 0),
], ids=["ok false, syncs failed", "ok false, no roles", "ok false, every role refused", "4xx"])
async def test_a_failed_start_clears_unless_the_answer_proves_nothing_was_registered(
        fake: Fake, answer: dict[str, Any], status: int, clears: int) -> None:
    """README "Python plugin SDK" → Start and stop: a failed start() clears what it may have
    registered. ``ok: false`` (HTTP 200) comes also when every role took the tool and each role's
    sync failed (docs/protocol.md R8): the registry holds it, so the clear must not be skipped. A
    4xx, or an ``ok: false`` with no role or every role refusing (``owned_by``), proves nothing was
    registered: the clear is skipped, so another instance's tools under the same source are left
    alone."""
    async def register(request: web.Request) -> web.StreamResponse:
        await request.read()
        return web.json_response(answer, status=status)
    fake.routes["api/tools/register"] = register
    plugin = new_plugin(fake)
    with pytest.raises(PluginError) as raised:
        await plugin.start()
    assert raised.value.code == errors.REFUSED
    assert fake.count("api/tools/clear") == clears


async def test_a_takeover_that_ended_is_forgotten_and_warned_about_again_when_it_comes_back(
        fake: Fake, caplog: pytest.LogCaptureFixture) -> None:
    """README "Plugin SDK": a name taken over is left alone with one warning, and only the takeovers
    the last check saw are remembered (roles made per conversation would otherwise pile up)."""
    taken = {"ok": True, "tools_by_role": {"default": [
        {"name": "probe", "source": "plugin:other", "callback_url": "http://127.0.0.1:9/other/probe"}]}}
    free = {"ok": True, "tools_by_role": {"default": []}}
    answers = [taken, free, taken]
    lists = 0

    async def listing(request: web.Request) -> web.StreamResponse:
        nonlocal lists
        # start()'s registration reads no list; then one answer per check, the last one repeated.
        answer = answers[min(lists, len(answers) - 1)]
        lists += 1
        return web.json_response(answer)
    fake.routes["api/tools"] = listing
    plugin = new_plugin(fake, role="default", poll_interval=0.05)
    async with plugin:
        await until(lambda: lists >= len(answers) + 1, "three checks")
    warnings = [r.getMessage() for r in caplog.records if "now belongs to" in r.getMessage()]
    assert warnings == ["'probe' in role 'default' now belongs to source 'plugin:other'; leaving it alone"] * 2, warnings


async def test_a_check_asks_for_the_plugins_own_names_only_in_queries_of_at_most_4096_characters(fake: Fake) -> None:
    """docs/protocol.md R18: the check lists ``?name=…`` of its own tools, never every tool; many
    names go in several requests, each name once (names with ``&``, ``=``, ``+``, ``%`` and
    non-ASCII arrive as they are)."""
    queries: list[tuple[str, list[str]]] = []

    async def listing(request: web.Request) -> web.StreamResponse:
        queries.append((request.query_string, request.query.getall("name", [])))
        return web.json_response({"ok": True, "tools_by_role": {"default": []}})

    fake.routes["api/tools"] = listing
    plugin = Plugin("many", toolport_url=fake.url, role="default", poll_interval=0.05, start_timeout=0,
                    use_events=False)
    names = [f"t{i}_a&b=c+d%e_名前".ljust(64, "€") for i in range(150)]
    for name in names:
        plugin.tool(lambda: "x", name=name)
    # One check's requests: names of 64 characters, most of them 9 once percent-encoded.
    per_check = len(_client.name_queries(names))
    assert per_check > 10
    async with plugin:
        await until(lambda: len(queries) >= per_check, "a check's requests")
    asked = [name for _, got in queries[:per_check] for name in got]
    assert asked == names
    assert all(len(query) <= 4096 for query, _ in queries), [len(q) for q, _ in queries]
    assert all("role=default" in query for query, _ in queries)
