"""Registering typed tools and calling them: through Toolport's API, its MCP endpoint, and directly."""
from __future__ import annotations

import asyncio
import base64
import datetime
import decimal
import gzip
import json
import logging
import sys
import threading
import uuid
from dataclasses import dataclass
from typing import Literal, Optional, TypedDict

import aiohttp
import pydantic
import pytest

from toolport_plugin import CallContext, Image, Plugin, PluginError, ToolError, ToolOutput

from .conftest import Api
from .models import Span

# A 1×1 PNG: real image bytes, so Toolport's checks (after merge) can accept it.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


def new_plugin(api: Api, **options: object) -> Plugin:
    return Plugin(f"test-{uuid.uuid4().hex[:8]}", toolport_url=api.tp.url, poll_interval=0.3, **options)  # type: ignore[arg-type]


async def post_callback(plugin: Plugin, name: str, arguments: object, headers: dict[str, str] | None = None) -> tuple[int, object]:
    """Calls the plugin's callback as Toolport would (docs/protocol.md R9)."""
    body = {"name": name, "arguments": arguments, "call_id": "call_direct", "raw_arguments": json.dumps(arguments)}
    async with aiohttp.ClientSession() as session:
        async with session.post(plugin.callback_url(name), json=body, headers=headers or {}) as res:
            text = await res.text()
            try:
                return res.status, json.loads(text)
            except ValueError:
                return res.status, text


class Place(TypedDict):
    lat: float
    lon: float


@dataclass
class Window:
    days: int = 1
    hourly: bool = False


class Query(pydantic.BaseModel):
    text: str

    @pydantic.field_validator("text")
    @classmethod
    def not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value


async def test_register_every_typed_tool_with_a_json_schema_from_its_type_hints(api: Api) -> None:
    plugin = new_plugin(api)

    @plugin.tool(description="Get the weather for a city.")
    async def get_weather(city: str, unit: Literal["c", "f"] = "c", days: Optional[int] = None) -> dict:
        return {"city": city, "unit": unit, "days": days}

    @plugin.tool
    def forecast(place: Place, window: Window, query: Query, tags: list[str] = []) -> dict:  # noqa: B006
        """Forecast for a place."""
        return {"lat": place["lat"], "days": window.days, "hourly": window.hourly, "text": query.text, "tags": tags}

    async with plugin:
        rows = {t["name"]: t for t in (await api.tools("default"))["default"]}
        assert rows["get_weather"]["source"] == plugin.source
        assert rows["get_weather"]["callback_url"] == plugin.callback_url("get_weather")
        assert rows["forecast"]["description"] == "Forecast for a place."
        # role=None: every role got them (docs/protocol.md R4)
        assert {"get_weather", "forecast"} <= {t["name"] for t in (await api.tools("Mochi"))["Mochi"]}

        status, defs = await api.get("/api/tools/definitions?role=default&format=mcp")
        assert status == 200
        schema = next(d["inputSchema"] for d in defs["tools"] if d["name"] == "get_weather")
        assert schema["required"] == ["city"]
        assert schema["properties"]["unit"] == {"type": "string", "enum": ["c", "f"], "default": "c"}
        assert schema["properties"]["days"]["anyOf"] == [{"type": "integer"}, {"type": "null"}]

        result = await api.call("forecast", {"place": {"lat": 59.9, "lon": 10.7}, "window": {"days": 3}, "query": {"text": "rain"}})
        assert result["is_error"] is False, result
        assert result["output"] == {"lat": 59.9, "days": 3, "hourly": False, "text": "rain", "tags": []}


async def test_a_call_through_the_api_returns_the_handler_output(api: Api) -> None:
    plugin = new_plugin(api)
    seen: list[tuple[str, str]] = []

    @plugin.tool(description="Get the weather for a city.")
    async def get_weather(city: str, ctx: CallContext, unit: Literal["c", "f"] = "c") -> dict:
        seen.append((ctx.name, ctx.call_id))
        return {"city": city, "temperature": 28 if unit == "c" else 82}

    @plugin.tool
    def shout(text: str) -> str:  # a plain function runs in a worker thread
        return text.upper()

    async with plugin:
        status, result = await api.post("/api/tools/call", {
            "role": "Mochi", "name": "get_weather", "call_id": "call_42", "raw_arguments": '{"city": "Oslo", "unit": "f"}',
        })
        assert status == 200
        assert result["is_error"] is False
        assert result["output"] == {"city": "Oslo", "temperature": 82}
        assert json.loads(result["text"]) == {"city": "Oslo", "temperature": 82}
        assert seen == [("get_weather", "call_42")]

        result = await api.call("shout", {"text": "hi"})
        assert (result["is_error"], result["output"], result["text"]) == (False, "HI", "HI")


async def mcp_request(session: aiohttp.ClientSession, url: str, headers: dict[str, str], method: str,
                      params: dict[str, object] | None = None, id: int | None = None) -> tuple[dict[str, str], object]:
    """One JSON-RPC message over MCP Streamable HTTP; the answer may be JSON or one SSE event."""
    message: dict[str, object] = {"jsonrpc": "2.0", "method": method, "params": params or {}}
    if id is not None:
        message["id"] = id
    async with session.post(url, json=message, headers={"accept": "application/json, text/event-stream", **headers}) as res:
        assert res.status in (200, 202), await res.text()
        text = await res.text()
        if res.content_type == "text/event-stream":
            data = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
            text = data[-1] if data else ""
        return dict(res.headers), (json.loads(text) if text else None)


async def test_a_call_through_the_mcp_endpoint_reaches_the_handler(api: Api) -> None:
    plugin = new_plugin(api)

    @plugin.tool(description="Add two integers.")
    async def add(a: int, b: int) -> dict:
        return {"sum": a + b}

    url = f"{api.tp.url}/mcp/default"
    async with plugin, aiohttp.ClientSession() as s:
        headers, answer = await mcp_request(s, url, {}, "initialize", {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "pytest", "version": "1"},
        }, id=1)
        assert answer["result"]["capabilities"]["tools"] is not None
        session = {"mcp-session-id": headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
        await mcp_request(s, url, session, "notifications/initialized")
        _, listed = await mcp_request(s, url, session, "tools/list", id=2)
        tool = next(t for t in listed["result"]["tools"] if t["name"] == "add")
        assert tool["description"] == "Add two integers."
        assert tool["inputSchema"]["required"] == ["a", "b"]
        _, called = await mcp_request(s, url, session, "tools/call", {"name": "add", "arguments": {"a": 2, "b": 40}}, id=3)
        result = called["result"]
        assert result["isError"] is False
        assert json.loads(result["content"][0]["text"]) == {"sum": 42}
        assert result["structuredContent"] == {"sum": 42}
        async with s.delete(url, headers=session) as res:
            assert res.status in (200, 204)


async def test_invalid_arguments_are_an_error_result_and_the_handler_is_not_called(api: Api) -> None:
    plugin = new_plugin(api)
    calls: list[object] = []

    @plugin.tool
    async def search(query: Query, limit: int = 10) -> list[str]:
        calls.append(query)
        return []

    async with plugin:
        # Toolport checks the registered schema first (the model can correct itself) ...
        result = await api.call("search", {"query": {"text": "x"}, "limit": "ten"})
        assert result["is_error"] is True
        # ... the plugin checks what JSON Schema cannot say (a pydantic validator) ...
        result = await api.call("search", {"query": {"text": "   "}})
        assert result["is_error"] is True
        assert result["error"].startswith("invalid arguments: query:")
        assert "must not be blank" in result["error"]
        # ... and validates the schema itself when called directly, without Toolport.
        status, reply = await post_callback(plugin, "search", {"query": {}, "extra": 1})
        assert status == 200
        assert reply["is_error"] is True
        assert reply["error"].startswith("invalid arguments:")
        assert "'text' is a required property" in reply["error"]
        assert "'extra' was unexpected" in reply["error"]
        assert calls == []


class Shade(pydantic.BaseModel):
    tone: Literal["light", "dark"]
    query: Query


class Code(pydantic.BaseModel):
    # A pattern Python's backtracking `re` takes exponential time over; pydantic's own engine does not.
    value: str = pydantic.Field(pattern=r"^(a*)*b$")


async def test_a_pydantic_pattern_is_checked_by_pydantic_not_by_backtracking_re_so_no_argument_can_stall_the_plugin(api: Api) -> None:
    plugin = new_plugin(api)

    @plugin.tool
    async def code(c: Code) -> str:
        return c.value

    @plugin.tool
    async def ping() -> str:
        return "pong"

    async with plugin:
        url = plugin.callback_url("code")
        # Sent straight to the callback, as any local process may: Toolport's own check (RE2) is
        # not in the way. 40 characters would take Python's re hours; a hang guard, not a timing.
        body = json.dumps({"name": "code", "arguments": {"c": {"value": "a" * 40 + "c"}}})
        async with aiohttp.ClientSession() as s:
            async with s.post(url, data=body, headers={"content-type": "application/json"}) as res:
                reply = await asyncio.wait_for(res.json(), 30)
        assert reply["is_error"] is True and reply["error"].startswith("invalid arguments: c:"), reply
        assert "should match pattern" in reply["error"], reply
        assert (await api.call("code", {"c": {"value": "aaab"}}))["output"] == "aaab"
        assert (await api.call("ping", {}))["output"] == "pong"


class Digits(pydantic.BaseModel):
    value: str = pydantic.Field(pattern=r"^[0-9]+$")


class Letters(pydantic.BaseModel):
    value: str = pydantic.Field(pattern=r"^[a-z]+$")


async def test_a_union_of_models_that_differ_by_a_pattern_takes_the_member_whose_pattern_fits(api: Api) -> None:
    """The schema check leaves patterns to pydantic, so a member whose schema fits but whose
    pattern does not is passed over for the next one."""
    plugin = new_plugin(api)

    @plugin.tool
    async def kind(v: Digits | Letters) -> str:
        return type(v).__name__

    async with plugin:
        assert (await api.call("kind", {"v": {"value": "123"}}))["output"] == "Digits"
        assert (await api.call("kind", {"v": {"value": "abc"}}))["output"] == "Letters"
        refused = await api.call("kind", {"v": {"value": "ABC"}})
        # Toolport itself refuses what neither pattern takes (RE2), before any call.
        assert refused["is_error"] is True and "must match pattern" in refused["error"], refused


async def test_arguments_a_conversion_refuses_or_an_optional_model_are_answered_as_results_never_a_500(
        api: Api, caplog: pytest.LogCaptureFixture) -> None:
    plugin = new_plugin(api)
    calls: list[object] = []

    @plugin.tool
    async def span(s: Span) -> int:
        calls.append(s)
        return s.hi - s.lo

    @plugin.tool
    async def shade(s: Optional[Shade] = None) -> str:
        calls.append(s)
        return "none" if s is None else f"{s.tone}:{s.query.text}"

    caplog.set_level(logging.DEBUG, logger="toolport_plugin")
    async with plugin:
        # A dataclass's __post_init__ refusing the values is the model's to fix, as a validator's is.
        result = await api.call("span", {"s": {"lo": 5, "hi": 1}})
        assert result["is_error"] is True and result["error"] == "invalid arguments: s: lo must be <= hi"
        assert (await api.call("span", {"s": {"lo": 1, "hi": 5}}))["output"] == 4
        # An optional model whose schema has $defs (a nested model) arrives as the model.
        assert (await api.call("shade", {"s": {"tone": "dark", "query": {"text": "x"}}}))["output"] == "dark:x"
        assert (await api.call("shade", {}))["output"] == "none"
        result = await api.call("shade", {"s": {"tone": "dark", "query": {"text": " "}}})
        assert result["is_error"] is True and "must not be blank" in result["error"]
    assert len(calls) == 3
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


async def test_an_exception_escaping_the_sdk_is_logged_at_error_on_the_plugins_logger_by_type_only(
        api: Api, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = new_plugin(api)

    @plugin.tool
    async def echo(text: str) -> str:
        return text

    # A fault inside the SDK itself, past its own error handling (the handler is never reached).
    def broken(raw: object) -> dict[str, object]:
        raise RuntimeError(f"sdk fault holding {raw!r}")

    caplog.set_level(logging.DEBUG, logger="toolport_plugin")
    async with plugin:
        monkeypatch.setattr(plugin.tools["echo"].signature, "arguments", broken)
        status, _ = await post_callback(plugin, "echo", {"text": "secret-argument"})
        assert status == 500
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == ["internal error in the plugin SDK (RuntimeError)"]
    assert all(r.name == "toolport_plugin" for r in errors)
    assert "secret-argument" not in caplog.text


async def test_a_tool_error_carries_its_output_and_other_exceptions_never_a_traceback(api: Api) -> None:
    plugin = new_plugin(api)

    @plugin.tool(description="Get the weather for a city.")
    async def get_weather(city: str) -> dict:
        if city == "Atlantis":
            raise ToolError("NO_DATA", output={"reason": "no such city"})
        raise KeyError("secret internals")

    async with plugin:
        status, reply = await post_callback(plugin, "get_weather", {"city": "Atlantis"})
        assert (status, reply) == (200, {"error": "NO_DATA", "output": {"reason": "no such city"}, "is_error": True})

        result = await api.call("get_weather", {"city": "Atlantis"})
        assert result["is_error"] is True
        assert result["error"] == "NO_DATA"
        # What the model reads: the error and the plugin's output beside it.
        assert json.loads(result["text"]) == {"error": "NO_DATA", "output": {"reason": "no such city"}}
        assert result["output"] == {"reason": "no such city"}

        status, reply = await post_callback(plugin, "get_weather", {"city": "Oslo"})
        assert reply == {"error": "KeyError: 'secret internals'", "is_error": True}
        assert "Traceback" not in json.dumps(reply)


class Price(pydantic.BaseModel):
    amount: decimal.Decimal
    currency: str = pydantic.Field(pattern=r"^[A-Z]{3}$")


async def test_a_model_whose_pydantic_schema_has_a_pattern_re2_cannot_run_registers_and_pydantic_checks_it(api: Api) -> None:
    # pydantic's own Decimal schema has a lookahead pattern, which Toolport's RE2 refuses: it is
    # left out of the registered schema (pydantic checks the value), a pattern RE2 runs is kept.
    plugin = new_plugin(api)

    @plugin.tool
    def total(price: Price, count: int) -> str:
        return str(price.amount * count)

    async with plugin:
        [row] = (await api.tools())["default"]
        assert row["name"] == "total"
        schema = plugin._tools["total"].parameters
        price = schema["properties"]["price"]["properties"]
        assert "pattern" not in json.dumps(price["amount"])
        assert price["currency"]["pattern"] == "^[A-Z]{3}$"
        result = await api.call("total", {"price": {"amount": "12.50", "currency": "EUR"}, "count": 2})
        assert (result["is_error"], result["output"]) == (False, "25.00")
        refused = await api.call("total", {"price": {"amount": "--1", "currency": "EUR"}, "count": 2})
        assert refused["is_error"] is True and refused["error"].startswith("invalid arguments: "), refused
        # Toolport checks the pattern it was given.
        wrong = await api.call("total", {"price": {"amount": 1, "currency": "eur"}, "count": 2})
        assert wrong["is_error"] is True and "pattern" in wrong["error"], wrong


class When(pydantic.BaseModel):
    at: datetime.time
    on: datetime.datetime
    zoned: pydantic.AwareDatetime
    lasting: datetime.timedelta = datetime.timedelta(0)


async def test_pydantic_time_and_datetime_fields_take_what_pydantic_takes_without_a_utc_offset(api: Api) -> None:
    # pydantic writes `format: time` / `date-time` for them, and those formats (as Toolport checks
    # them) require an offset that pydantic does not: the formats are left out, pydantic checks.
    plugin = new_plugin(api)

    @plugin.tool
    def plan(when: When) -> str:
        return f"{when.at.isoformat()} {when.on.isoformat()} {when.zoned.utcoffset()}"

    async with plugin:
        result = await api.call("plan", {"when": {"at": "12:30:00", "on": "2024-01-01T12:00:00",
                                                  "zoned": "2024-01-01T12:00:00+02:00"}})
        assert (result["is_error"], result["output"]) == (False, "12:30:00 2024-01-01T12:00:00 2:00:00"), result
        for lasting in ("PT0.5S", "01:00:00"):  # pydantic's own JSON, and a form it takes
            lasted = await api.call("plan", {"when": {"at": "12:30:00", "on": "2024-01-01T12:00:00",
                                                      "zoned": "2024-01-01T12:00:00Z", "lasting": lasting}})
            assert lasted["is_error"] is False, (lasting, lasted)
        naive = await api.call("plan", {"when": {"at": "12:30:00", "on": "2024-01-01T12:00:00",
                                                 "zoned": "2024-01-01T12:00:00"}})
        assert naive["is_error"] is True and "invalid arguments: " in naive["error"], naive
        wrong = await api.call("plan", {"when": {"at": "noon", "on": "2024-01-01T12:00:00",
                                                 "zoned": "2024-01-01T12:00:00Z"}})
        assert wrong["is_error"] is True, wrong


class Halt(BaseException):
    pass


async def test_a_tool_raising_system_exit_or_another_base_exception_fails_its_call_never_the_plugin(api: Api) -> None:
    # A Task lets SystemExit and KeyboardInterrupt out of the event loop: a tool calling sys.exit()
    # ended the whole plugin (and a host embedding it), and a BaseException of its own left the
    # call without an answer.
    plugin = new_plugin(api)

    @plugin.tool
    def sync_exit(code: int) -> None:
        sys.exit(code)

    @plugin.tool
    async def async_exit(code: int) -> None:
        raise SystemExit(code)

    @plugin.tool
    def sync_interrupt() -> None:
        raise KeyboardInterrupt

    @plugin.tool
    async def halt() -> None:
        raise Halt("stopped")

    async with plugin:
        assert await post_callback(plugin, "sync_exit", {"code": 2}) == (200, {"error": "SystemExit: 2", "is_error": True})
        assert await post_callback(plugin, "async_exit", {"code": 3}) == (200, {"error": "SystemExit: 3", "is_error": True})
        assert await post_callback(plugin, "sync_interrupt", {}) == (200, {"error": "KeyboardInterrupt", "is_error": True})
        assert await post_callback(plugin, "halt", {}) == (200, {"error": "Halt: stopped", "is_error": True})
        # The plugin is still serving, and still registered.
        result = await api.call("sync_exit", {"code": 4})
        assert (result["is_error"], result["error"]) == (True, "SystemExit: 4")


async def test_images_travel_in_the_reply_images_channel(api: Api) -> None:
    plugin = new_plugin(api)

    @plugin.tool
    async def radar(city: str) -> ToolOutput:
        return ToolOutput({"city": city}, images=[Image.from_bytes(PNG, mime="image/png", vision_prompt="rain radar")])

    @plugin.tool
    async def snapshot() -> Image:
        return Image.from_bytes(PNG, mime="image/png")

    async with plugin:
        status, reply = await post_callback(plugin, "radar", {"city": "Oslo"})
        assert status == 200
        assert reply == {
            "output": {"city": "Oslo"}, "is_error": False,
            "images": [{"data_b64": base64.b64encode(PNG).decode(), "mime": "image/png", "vision_prompt": "rain radar"}],
        }
        status, reply = await post_callback(plugin, "snapshot", {})
        assert reply["output"] is None
        assert [base64.b64decode(i["data_b64"]) for i in reply["images"]] == [PNG]

        result = await api.call("radar", {"city": "Oslo"})
        assert result["is_error"] is False
        assert result["output"]["city"] == "Oslo"
        assert [(i["mime_type"], base64.b64decode(i["data_base64"]), i.get("prompt")) for i in result["images"]] == [
            ("image/png", PNG, "rain radar")
        ]


async def test_the_deadline_header_cancels_the_handler(api: Api) -> None:
    plugin = new_plugin(api)
    cancelled = asyncio.Event()
    thread_saw_cancel = threading.Event()

    reasons: list[str | None] = []

    @plugin.tool(timeout_seconds=1)
    async def slow(ctx: CallContext) -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            reasons.append(ctx.cancel_reason)
            cancelled.set()
            raise
        return "too late"

    # 2 s: Toolport hangs up at its deadline up to the call's transit time before the plugin's
    # clock runs out, which counts as the deadline within a quarter of it (500 ms).
    plugin.tool(slow, name="slow_2s", timeout_seconds=2)

    @plugin.tool(timeout_seconds=1)
    def slow_sync(ctx: CallContext) -> str:
        if ctx.cancelled.wait(30):
            thread_saw_cancel.set()
        return "too late"

    async with plugin:
        status, reply = await post_callback(plugin, "slow", {}, {"x-toolport-deadline-ms": "200"})
        assert (status, reply) == (200, {"error": "the call's deadline of 200 ms passed", "is_error": True})
        await asyncio.wait_for(cancelled.wait(), 5)

        status, reply = await post_callback(plugin, "slow_sync", {}, {"x-toolport-deadline-ms": "200"})
        assert reply["is_error"] is True
        assert await asyncio.to_thread(thread_saw_cancel.wait, 5)

        # Through Toolport: its deadline (timeout_seconds=2) ends the call, and the handler with it.
        # Toolport hangs up at its deadline, a little before the plugin's own clock runs out: the
        # handler is told it was the deadline all the same.
        for _ in range(2):
            cancelled.clear()
            result = await api.call("slow_2s", {})
            assert result["is_error"] is True
            await asyncio.wait_for(cancelled.wait(), 5)
        assert reasons == ["deadline"] * 3, reasons


async def test_a_closed_connection_cancels_the_handler(api: Api) -> None:
    plugin = new_plugin(api)
    started = asyncio.Event()
    reasons: list[str | None] = []
    cancelled = asyncio.Event()

    @plugin.tool(timeout_seconds=60)
    async def wait_forever(ctx: CallContext) -> str:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            reasons.append(ctx.cancel_reason)
            cancelled.set()
            raise
        return "never"

    async with plugin:
        call = asyncio.create_task(post_callback(plugin, "wait_forever", {}))
        await asyncio.wait_for(started.wait(), 5)
        call.cancel()  # the client hangs up, as Toolport does for a cancelled call
        await asyncio.wait_for(cancelled.wait(), 5)
        assert reasons == ["disconnected"]


async def test_stop_lets_calls_in_flight_finish_for_the_grace_period_then_cancels_them(api: Api) -> None:
    plugin = new_plugin(api)
    started = asyncio.Event()
    cancelled = asyncio.Event()

    @plugin.tool(timeout_seconds=30)
    async def slow(seconds: float) -> str:
        started.set()
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "done"

    await plugin.start()
    quick = asyncio.create_task(api.call("slow", {"seconds": 0.5}))
    await asyncio.wait_for(started.wait(), 10)
    stopped = await plugin.stop(grace=5)
    assert stopped.is_cleared
    assert (await quick)["output"] == "done"  # it finished although stop() had begun
    assert not cancelled.is_set()

    plugin = new_plugin(api)
    plugin.tool(slow)
    started.clear()
    await plugin.start()
    stuck = asyncio.create_task(api.call("slow", {"seconds": 30}))
    await asyncio.wait_for(started.wait(), 10)
    await plugin.stop(grace=0.2)
    await asyncio.wait_for(cancelled.wait(), 5)  # past the grace period the handler is cancelled
    assert (await stuck)["is_error"] is True


async def test_the_callback_server_answers_only_toolport_calls(api: Api) -> None:
    plugin = new_plugin(api)

    @plugin.tool
    async def ping() -> str:
        return "pong"

    async with plugin:
        url = plugin.callback_url("ping")
        body = json.dumps({"name": "ping", "arguments": {}})
        async with aiohttp.ClientSession() as s:
            async def status(method: str, target: str, headers: dict[str, str], data: str | None = body) -> int:
                async with s.request(method, target, data=data, headers=headers) as res:
                    return res.status
            json_type = {"content-type": "application/json"}
            assert await status("POST", url, json_type) == 200
            assert await status("POST", url, {**json_type, "host": "evil.example"}) == 403
            assert await status("POST", url, {**json_type, "origin": "http://127.0.0.1:1"}) == 403
            assert await status("POST", plugin.url + "/tools/ping", json_type) == 404
            assert await status("GET", url, {}, None) == 405
            assert await status("POST", url, {"content-type": "text/plain"}) == 415
            assert await status("POST", url.rsplit("/", 1)[0] + "/nope", json_type) == 404


async def test_a_direct_caller_cannot_make_the_callback_server_inflate_a_body_or_take_nan_or_a_huge_deadline(api: Api) -> None:
    """A compressed body is refused before it is read (never inflated on the event loop); NaN and
    Infinity are not JSON; a deadline header of thousands of digits is not a crash."""
    plugin = new_plugin(api)
    seen: list[float] = []

    @plugin.tool
    async def scale(x: float, ctx: CallContext) -> float:
        seen.append(ctx.remaining())
        return x * 2

    async with plugin:
        url = plugin.callback_url("scale")
        json_type = {"content-type": "application/json"}
        async with aiohttp.ClientSession(auto_decompress=False) as s:
            async def send(data: bytes, headers: dict[str, str]) -> tuple[int, str]:
                async with s.post(url, data=data, headers={**json_type, **headers}) as res:
                    return res.status, await res.text()
            # 8 MiB of zeros, 8 KiB compressed: refused without inflating it.
            bomb = gzip.compress(b"{" + b" " * (8 * 1024 * 1024) + b"}")
            for coding in ("gzip", "identity, gzip", "br"):
                assert (await send(bomb, {"content-encoding": coding}))[0] == 415, coding
            ok = json.dumps({"name": "scale", "arguments": {"x": 2}}).encode()
            assert await send(ok, {"content-encoding": "identity"}) == (200, '{"output":4.0,"is_error":false}')
            for constant in ("NaN", "Infinity", "-Infinity"):
                body = b'{"name":"scale","arguments":{"x":' + constant.encode() + b"}}"
                assert (await send(body, {}))[0] == 400, constant
            status, text = await send(ok, {"x-toolport-deadline-ms": "9" * 5000})
            assert (status, text) == (200, '{"output":4.0,"is_error":false}')
    assert len(seen) == 2 and all(left > 0 for left in seen)


async def test_a_connection_that_sends_no_request_is_closed_so_idle_sockets_cannot_pile_up(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("toolport_plugin._server._FIRST_REQUEST_SECONDS", 0.3)
    plugin = new_plugin(api)

    @plugin.tool
    async def ping() -> str:
        return "pong"

    async with plugin:
        port = int(plugin.url.rsplit(":", 1)[1])
        silent_reader, silent_writer = await asyncio.open_connection("127.0.0.1", port)
        half_reader, half_writer = await asyncio.open_connection("127.0.0.1", port)
        half_writer.write(b"POST /x HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        # Both are closed by the plugin (read() ends); a hang guard, not a timing.
        assert await asyncio.wait_for(silent_reader.read(), 10) == b""
        assert await asyncio.wait_for(half_reader.read(), 10) == b""
        for writer in (silent_writer, half_writer):
            writer.close()
        # A connection that sends its request at once is served.
        assert (await api.call("ping", {}))["output"] == "pong"


async def test_start_refuses_an_unknown_role_at_once(api: Api) -> None:
    plugin = new_plugin(api, role="Nobody")

    @plugin.tool
    async def ping() -> str:
        return "pong"

    with pytest.raises(PluginError) as info:
        await plugin.start()
    assert info.value.code == "TP_ERR_PLUGIN_REFUSED"
    assert (info.value.status, info.value.toolport_code) == (404, "TP_ERR_ROLE_NOT_FOUND")
    assert plugin.url == "" or not plugin.is_running


def test_invalid_options_are_refused_with_every_problem_named() -> None:
    with pytest.raises(PluginError) as info:
        Plugin("", toolport_url="http://192.0.2.1:3917", poll_interval=0, host="0.0.0.0")
    assert info.value.code == "TP_ERR_PLUGIN_OPTIONS"
    assert [d["path"] for d in info.value.details] == ["id", "toolport_url", "host", "poll_interval"]
