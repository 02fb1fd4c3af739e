"""What the TypeScript SDK does, the Python SDK does too (README "Python plugin SDK": it "does the
same as the TypeScript SDK"), against a real Toolport.

Each test pins a difference test/integration/sdk-differential-properties.test.ts found between the
two SDKs (since fixed), in its smallest form: replies Toolport carries whatever their strings or
depth, tool schemas judged by Toolport's rules (its ``$schema`` dialects, RE2) and not Python's,
arguments Toolport accepted never refused again, and the options both SDKs accept or refuse alike.
"""
from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from toolport_plugin import PLUGIN_ERROR_CODES, CallContext, Plugin, PluginError, ToolError
from toolport_plugin._results import output_reply

from .conftest import Api


def new_plugin(api: Api, **options: Any) -> Plugin:
    return Plugin(f"parity-{uuid.uuid4().hex[:8]}", toolport_url=api.tp.url, role="default", use_events=False,
                  poll_interval=60, start_timeout=0, **options)


def echo_tool(plugin: Plugin, name: str, parameters: dict[str, Any] | None = None) -> None:
    async def echo(**kwargs: Any) -> Any:
        return kwargs
    plugin.tool(echo, name=name, parameters={"type": "object"} if parameters is None else parameters)


def behave_tool(plugin: Plugin, name: str, behaviour: Callable[[], Awaitable[Any]]) -> None:
    async def behave(**kwargs: Any) -> Any:
        return await behaviour()
    plugin.tool(behave, name=name, parameters={"type": "object"})


def options_error(make: Callable[[], Any]) -> PluginError:
    with pytest.raises(PluginError) as info:
        make()
    assert info.value.code == "TP_ERR_PLUGIN_OPTIONS", info.value
    return info.value


# ---- replies (docs/protocol.md R10, R11) ----------------------------------------------------


async def test_a_lone_surrogate_in_an_output_or_a_tool_error_reaches_the_caller(api: Api) -> None:
    plugin = new_plugin(api)
    echo_tool(plugin, "echo")

    async def surrogate_key() -> Any:
        return {"k\udc00": "a\ud800b", "pair": "\ud83d\ude00", "text": "é😀"}

    async def raise_it() -> Any:
        raise ToolError("bad \ud800 input", output={"q": "x\udfff"})

    behave_tool(plugin, "keys", surrogate_key)
    behave_tool(plugin, "raises", raise_it)
    async with plugin:
        # Toolport delivers the argument as the JSON escape \udfff: UTF-8 has no encoding for it.
        result = await api.call("echo", {"q": "x\udfff"})
        assert (result["is_error"], result["output"]) == (False, {"q": "x\udfff"}), result
        result = await api.call("keys", {})
        # A pair of surrogates is the character they make, as in JSON.stringify's output.
        assert (result["is_error"], result["output"]) == (False, {"k\udc00": "a\ud800b", "pair": "😀", "text": "é😀"})
        result = await api.call("raises", {})
        assert (result["is_error"], result["error"], result["output"]) == (True, "bad \ud800 input", {"q": "x\udfff"}), result


async def test_an_output_nested_deeper_than_python_recurses_is_the_output(api: Api) -> None:
    plugin = new_plugin(api)

    def nested(n: int) -> list[Any]:
        value: list[Any] = []
        for _ in range(n):
            value = [value]
        return value

    async def deep() -> Any:
        return nested(600)

    async def cycle() -> Any:
        value: dict[str, Any] = {"a": [1]}
        value["a"].append(value)
        return value

    behave_tool(plugin, "deep", deep)
    behave_tool(plugin, "cycle", cycle)
    async with plugin:
        result = await api.call("deep", {})
        assert result["is_error"] is False, str(result)[:300]
        assert result["output"] == nested(600)
        result = await api.call("cycle", {})
        assert result["is_error"] is True
        assert result["error"].startswith("the tool's output could not be encoded as JSON")
    # Far deeper than json.dumps recurses (Toolport's reply scan has no depth limit of its own).
    n = 20_000
    assert output_reply(nested(n)) == b'{"output":' + b"[" * (n + 1) + b"]" * (n + 1) + b',"is_error":false}'


async def test_arguments_nested_deeper_than_python_recurses_reach_the_handler(api: Api) -> None:
    plugin = new_plugin(api)

    async def depth(a: Any = None) -> int:
        n = 0
        while isinstance(a, list) and a:
            a, n = a[0], n + 1
        return n

    plugin.tool(depth, name="depth", parameters={"type": "object"})
    async with plugin:
        # raw_arguments is a string in the call: Toolport checks its schema, not its depth.
        n = 5000
        status, result = await api.post("/api/tools/call", {"role": "default", "name": "depth",
                                                            "raw_arguments": '{"a":' + "[" * n + "0" + "]" * n + "}"})
        assert status == 200 and (result["is_error"], result["output"]) == (False, n), result


# ---- explicit parameters: Toolport's rules (docs/protocol.md R7) -----------------------------

DRAFT_07 = "http://json-schema.org/draft-07/schema#"


def prop(schema: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {"a": schema}, **extra}


# Schemas Toolport registers, which Python's own rules once refused.
TOOLPORT_TAKES = {
    "draft-07 tuple": {"$schema": DRAFT_07, **prop({"type": "array", "items": [{"type": "string"}], "additionalItems": False})},
    "2019-09 keyword": {"$schema": "https://json-schema.org/draft/2019-09/schema", **prop({"type": "integer"}),
                        "$recursiveAnchor": True},
    "2020-12 by URI without #": {"$schema": "https://json-schema.org/draft/2020-12/schema", **prop({"type": "string"})},
    "RE2 Unicode class": prop({"type": "string", "pattern": "^\\p{L}+$"}),
    "POSIX class": prop({"type": "string", "pattern": "[[:alpha:]]"}),
    "lookahead in an unused definition": {"type": "object", "$defs": {"x": {"type": "string", "pattern": "(?=a)"}}},
    "local $ref": {**prop({"$ref": "#/$defs/s"}), "$defs": {"s": {"type": "string"}}},
    "anchor $ref": {**prop({"$ref": "#s"}), "$defs": {"s": {"$anchor": "s", "type": "string"}}},
    "the whole schema (a recursive tree)": {"type": "object", "properties": {
        "name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}}, "required": ["name"]},
    "the whole schema as an empty reference": {**prop({"$ref": ""})},
    "an unknown format": prop({"type": "string", "format": "no-such-format"}),
    "2020-12 enum with duplicates": prop({"enum": [1, 1]}),
    # What Toolport's validator never compiles, it never refuses: parts it skips as always valid.
    "a draft-07 lookahead key whose schema is {}": {"$schema": DRAFT_07, "type": "object", "patternProperties": {"(?=a)": {}}},
    "a lookahead in an if without then": {"type": "object", "if": prop({"pattern": "(?=a)"}), "then": {"description": "d"}},
    "a lookahead in a draft-07 anyOf beside {}": {"$schema": DRAFT_07, "type": "object", "anyOf": [{}, prop({"pattern": "(?=a)"})]},
    "a lookahead in contains with minContains 0": {"$schema": "https://json-schema.org/draft/2019-09/schema", "type": "object",
                                                   "contains": {"pattern": "(?=a)"}, "minContains": 0},
    "a lookahead in additionalItems without an items array": {"$schema": DRAFT_07, "type": "object",
                                                              "additionalItems": {"pattern": "(?=a)"}},
}

# Schemas Toolport refuses, which the SDK once took (and start() failed, or sent a body that is not JSON).
TOOLPORT_REFUSES = {
    "draft-04": ({"$schema": "http://json-schema.org/draft-04/schema#", "type": "object"}, "not a dialect Toolport validates"),
    "$schema not a string": ({"$schema": 4, "type": "object"}, "$schema must be a string"),
    "lookahead": (prop({"type": "string", "pattern": "(?=a)a"}), "cannot run on RE2"),
    "\\Z": (prop({"type": "string", "pattern": "a\\Z"}), "cannot run on RE2"),
    "backreference": (prop({"type": "string", "pattern": "(a)\\1"}), "cannot run on RE2"),
    "possessive": ({"type": "object", "patternProperties": {"^a*+$": {"type": "string"}}}, "cannot run on RE2"),
    "a lookahead behind a $ref": ({**prop({"$ref": "#/$defs/x"}), "$defs": {"x": {"pattern": "(?<=a)b"}}}, "cannot run on RE2"),
    "missing $ref": (prop({"$ref": "#/$defs/missing"}), "does not resolve"),
    "missing anchor": (prop({"$ref": "#nowhere"}), "does not resolve"),
    "another document": (prop({"$ref": "other.json"}), "does not resolve"),
    "a lookahead key beside additionalProperties false": ({"type": "object", "patternProperties": {"(?=a)": {}},
                                                           "additionalProperties": False}, "cannot run on RE2"),
    "a lookahead in a 2020-12 anyOf beside {}": ({"type": "object", "anyOf": [{}, prop({"pattern": "(?=a)"})]}, "cannot run on RE2"),
    "Infinity": (prop({"type": "number", "maximum": float("inf")}), "not a finite number"),
    "NaN default": (prop({"default": float("nan")}), "not a finite number"),
    "an int past a double": (prop({"maximum": 10 ** 400}), "beyond a double's range"),
    "a set": (prop({"enum": {1, 2}}), "not a JSON value"),
    "meta-schema": ({"type": "object", "required": ["a", "a"]}, "not a valid 2020-12 JSON Schema"),
    "draft-07 meta-schema": ({"$schema": DRAFT_07, "type": "object", "minProperties": 1.5}, "not a valid draft-07 JSON Schema"),
    # Toolport's draft-07 meta-schema (Ajv's) wants an enum without duplicates, the published one does not.
    "draft-07 enum with duplicates": ({"$schema": DRAFT_07, **prop({"enum": ["", "", 0]})}, "not a valid draft-07 JSON Schema"),
    "an empty enum": (prop({"enum": []}), "enum is empty"),
}


@pytest.mark.parametrize("schema", list(TOOLPORT_TAKES.values()), ids=list(TOOLPORT_TAKES))
async def test_an_explicit_schema_toolport_takes_is_declared_and_registered(api: Api, schema: dict[str, Any]) -> None:
    plugin = new_plugin(api)
    echo_tool(plugin, "echo", schema)
    async with plugin:
        rows = [t for t in (await api.tools("default"))["default"] if t["source"] == plugin.source]
        assert [t["name"] for t in rows] == ["echo"]


async def test_a_recursive_schema_by_a_reference_to_the_whole_schema_checks_every_level(api: Api) -> None:
    plugin = new_plugin(api)
    echo_tool(plugin, "tree", TOOLPORT_TAKES["the whole schema (a recursive tree)"])
    async with plugin:
        tree = {"name": "root", "children": [{"name": "a", "children": [{"name": "b"}]}]}
        result = await api.call("tree", tree)
        assert result["is_error"] is False, result
        assert result["output"] == tree
        refused = await api.call("tree", {"name": "root", "children": [{"children": []}]})
        assert refused["is_error"] is True
        assert "name" in refused["error"], refused


@pytest.mark.parametrize("schema, why", list(TOOLPORT_REFUSES.values()), ids=list(TOOLPORT_REFUSES))
def test_an_explicit_schema_toolport_refuses_is_refused_when_declared(schema: dict[str, Any], why: str) -> None:
    plugin = Plugin("parity")
    err = options_error(lambda: echo_tool(plugin, "echo", schema))
    assert why in err.message, err.message


def test_a_cyclic_schema_is_refused_when_declared() -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {}}
    schema["properties"]["a"] = schema
    err = options_error(lambda: echo_tool(Plugin("parity"), "echo", schema))
    assert "refers to itself" in err.message


# Every pattern the SDK refuses when declared, Toolport refuses too: the SDK only says sooner what
# Toolport would say at start(). Each has its own reason RE2 cannot run it.
SURELY_REFUSED = ["(?=a)", "(?!a)", "(?<=a)b", "(?<!a)b", "(?>a)", "(?P=n)", "(?#c)", "(?(1)a|b)", "(?x)a", "\\1",
                  "[\\1]", "\\8", "\\Z", "\\G", "\\e", "\\h", "\\R", "\\X", "\\N", "\\k<n>", "[\\b]", "[\\Q]\\E]", "a*+",
                  "a++", "a?+", "a**", "a*??", "a{2}+", "a{1,2}{3}", "x{1001}", "a{2,1}", "*a", "a|*", "(a", "a)", "[a",
                  "\\", "(?i"]
# And these it leaves to Toolport (accepted by RE2, or refused for a reason the SDK does not judge).
LEFT_TO_TOOLPORT = ["\\p{L}", "[[:alpha:]]", "\\pN{2}", "(?i)abc", "a(?i)b", "(?P<n>a)", "(?<n>a)", "(?i:a)", "\\Qa\\Z\\E",
                    "[(?=a)]", "\\\\Z", "\\12", "\\0", "\\x{41}", "\\u0041", "a{,3}", "x{1000}", "^*", "[]a]", "\\z",
                    "\\p{NoSuchClass}", "[[:foo:]]"]


async def test_the_patterns_refused_when_declared_are_those_toolport_refuses(api: Api) -> None:
    for pattern in SURELY_REFUSED + LEFT_TO_TOOLPORT:
        schema = prop({"type": "string", "pattern": pattern})
        try:
            echo_tool(Plugin("parity"), "echo", schema)
            refused_early = False
        except PluginError:
            refused_early = True
        assert refused_early == (pattern in SURELY_REFUSED), pattern
        status, body = await api.post("/api/tools/register", {
            "name": f"re-{uuid.uuid4().hex[:8]}", "source": "plugin:parity-re", "role": "default",
            "callback_url": "http://127.0.0.1:9/tools/x", "parameters": schema})
        if refused_early:
            assert status == 422, (pattern, status, body)
    await api.post("/api/tools/clear", {"source": "plugin:parity-re"})


def test_a_property_with_the_name_of_the_context_parameter_is_refused_when_declared() -> None:
    async def handler(ctx: CallContext, **kwargs: Any) -> Any:
        return kwargs

    schema = {"type": "object", "properties": {"ctx": {"type": "string"}}}
    err = options_error(lambda: Plugin("parity").tool(handler, name="t", parameters=schema))
    assert "CallContext" in err.message


# ---- arguments: never refused again after Toolport accepted them (docs/protocol.md R9) ------


async def test_arguments_toolport_accepted_reach_the_handler_of_an_explicit_schema(api: Api) -> None:
    plugin = new_plugin(api)
    patterns = {"posix": "[[:alpha:]]", "not_space": "^\\S+$", "boundary": "a\\b"}
    for name, pattern in patterns.items():
        echo_tool(plugin, name, prop({"type": "string", "pattern": pattern}))
    echo_tool(plugin, "max", prop({"type": "integer", "maximum": 2 ** 53}))

    async def with_context(ctx: CallContext, **kwargs: Any) -> Any:
        return kwargs

    plugin.tool(with_context, name="context", parameters={"type": "object"})
    async with plugin:
        # RE2 reads these as Toolport does; Python's re did not ([[:alpha:]] is a set of ":",
        # "[" … there; \S refuses a no-break space and a vertical tab; \b sees "é" as a word letter).
        for name, value in [("posix", "b"), ("not_space", "a\u00a0b"), ("not_space", "a\u000bb"), ("boundary", "aé")]:
            result = await api.call(name, {"a": value})
            assert (result["is_error"], result["output"]) == (False, {"a": value}), (name, value, result)
        # 2^53 + 1 reads as 2^53 in Toolport (a double), within the maximum; Python reads it exactly.
        status, result = await api.post("/api/tools/call", {"role": "default", "name": "max",
                                                            "raw_arguments": '{"a": 9007199254740993}'})
        assert status == 200 and result["is_error"] is False, result
        # An argument named as the handler's CallContext parameter cannot reach it: a tool error
        # says so (it was once replaced by the context without a word).
        result = await api.call("context", {"ctx": 1, "b": 2})
        assert result["is_error"] is True and result["error"].startswith("invalid arguments: ctx:"), result
        assert (await api.call("context", {"b": 2}))["output"] == {"b": 2}


# ---- options: as the TypeScript SDK checks them (README option tables) ----------------------


@pytest.mark.parametrize("option", ["poll_interval", "resync_interval", "max_backoff", "request_timeout", "start_timeout"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1, True, "5", 10 ** 400])
def test_a_duration_that_is_no_finite_number_of_seconds_is_refused(option: str, value: Any) -> None:
    err = options_error(lambda: Plugin("parity", **{option: value}))
    assert [d["path"] for d in err.details] == [option]


async def test_start_timeout_zero_fails_at_once_and_nan_never_starts_a_retry_loop() -> None:
    options_error(lambda: Plugin("parity", start_timeout=float("nan")))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{probe.getsockname()[1]}"
    plugin = Plugin("parity", toolport_url=down, start_timeout=0)
    plugin.tool(lambda: None, name="t")
    with pytest.raises(PluginError) as info:
        await asyncio.wait_for(plugin.start(), 10)
    assert info.value.code == "TP_ERR_PLUGIN_UNREACHABLE"


@pytest.mark.parametrize("token", ["", "  ", "a\nb", "abc\r", "tök" + "x" * 40, "t😀" + "x" * 40, " " + "x" * 40, "a b" * 20])
def test_a_token_is_visible_ascii_only(token: str) -> None:
    err = options_error(lambda: Plugin("parity", token=token))
    assert [d["path"] for d in err.details] == ["token"]
    assert "visible ASCII" in err.message


def test_a_token_shorter_than_toolports_shortest_is_refused() -> None:
    # Toolport's security.token is at least 32 bytes: a shorter token could never be accepted.
    err = options_error(lambda: Plugin("parity", token="x" * 31))
    assert [d["path"] for d in err.details] == ["token"]
    assert "at least 32" in err.message
    Plugin("parity", token="x" * 32)


def test_a_token_file_holding_other_characters_is_refused_naming_the_file(tmp_path: Any) -> None:
    path = tmp_path / "token"
    path.write_text("tök" + "x" * 40 + "\n", encoding="utf-8")
    err = options_error(lambda: Plugin("parity", token_file=str(path)))
    assert [d["path"] for d in err.details] == ["token_file"]
    assert str(path) in err.message and "visible ASCII" in err.message


def test_an_empty_token_file_is_refused_as_empty_naming_it_and_where_its_name_came_from(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "token"
    path.write_text("\n", encoding="utf-8")
    err = options_error(lambda: Plugin("parity", token_file=str(path)))
    assert [d["path"] for d in err.details] == ["token_file"]
    assert f"{str(path)!r} is empty" in err.message
    monkeypatch.setenv("TOOLPORT_TOKEN_FILE", str(path))
    err = options_error(lambda: Plugin("parity"))
    assert "(from TOOLPORT_TOKEN_FILE) is empty" in err.message
    missing = tmp_path / "missing"
    err = options_error(lambda: Plugin("parity", token_file=str(missing)))
    assert f"{str(missing)!r} cannot be read" in err.message


@pytest.mark.parametrize("suffix", ["/?via=sdk", "#api", "/?a=1#b"])
async def test_a_toolport_url_with_a_query_or_a_fragment_reaches_the_api(api: Api, suffix: str) -> None:
    plugin = Plugin(f"parity-{uuid.uuid4().hex[:8]}", toolport_url=api.tp.url + suffix, role="default",
                    start_timeout=0, use_events=True)
    plugin.tool(lambda: "ok", name="t")
    async with plugin:
        assert (await api.call("t", {}))["output"] == "ok"
        await api.wait_for(lambda: _true(plugin.watch_mode == "events"), 5, "the event stream followed")


async def _true(value: bool) -> bool:
    return value


# Spellings the WHATWG URL parser (the TypeScript SDK's, and Toolport's for callback URLs) reads as
# a loopback URL, or refuses: the same verdict here (urllib's reading differed for each).
@pytest.mark.parametrize("spelling", ["http://127.1:{port}", "http:\\\\127.0.0.1:{port}", " http://127.0.0.1:{port} ",
                                      "http://0x7f.0.0.1:{port}", "http://2130706433:{port}", "http://127.0.0.1.:{port}",
                                      "http:127.0.0.1:{port}", "HTTP://LOCALHOST:{port}", "http://127.000.000.001:{port}"])
async def test_a_toolport_url_the_whatwg_parser_reads_as_loopback_reaches_the_api(api: Api, spelling: str) -> None:
    plugin = Plugin(f"parity-{uuid.uuid4().hex[:8]}", toolport_url=spelling.format(port=api.tp.port), role="default",
                    start_timeout=0, use_events=False)
    plugin.tool(lambda: "ok", name="t")
    async with plugin:
        assert (await api.call("t", {}))["output"] == "ok"


@pytest.mark.parametrize("url", ["http://127.0.0.1:0", "http://[::1%25lo]:3917", "http://@127.0.0.1:3917",
                                 "http://localhost.:3917", "http://x.localhost:3917", "http://[::127.0.0.1]:3917",
                                 "http://127.0.0.256:3917", "http://0177.0.0.1.0:3917", "ftp://127.0.0.1", "127.0.0.1:3917"])
def test_a_toolport_url_the_whatwg_parser_does_not_read_as_loopback_is_refused(url: str) -> None:
    err = options_error(lambda: Plugin("parity", toolport_url=url))
    assert [d["path"] for d in err.details] == ["toolport_url"]


def test_an_empty_tool_name_is_refused_not_replaced_by_the_functions_name() -> None:
    def get_weather() -> str:
        return "sunny"

    err = options_error(lambda: Plugin("parity").tool(get_weather, name=""))
    assert "1–64 characters" in err.message
    plugin = Plugin("parity")
    plugin.tool(get_weather)
    assert list(plugin.tools) == ["get_weather"]


@pytest.mark.parametrize("description", [42, b"bytes", ["a"]])
def test_a_description_that_is_not_a_string_is_refused(description: Any) -> None:
    err = options_error(lambda: Plugin("parity").tool(lambda: None, name="t", description=description))
    assert "description" in err.message


async def test_the_source_length_is_counted_in_utf16_units_as_toolport_counts(api: Api) -> None:
    # "plugin:" + 124 astral characters: 7 + 248 = 255 units; one more is 257.
    options_error(lambda: Plugin("😀" * 125))
    plugin = Plugin("😀" * 124, toolport_url=api.tp.url, role="default", start_timeout=0, use_events=False)
    plugin.tool(lambda: "ok", name="t")
    async with plugin:
        rows = [t for t in (await api.tools("default"))["default"] if t["source"] == "plugin:" + "😀" * 124]
        assert [t["name"] for t in rows] == ["t"]


@pytest.mark.parametrize("option, value", [("port", True), ("port", 1.5), ("use_events", "yes"), ("use_events", 1),
                                           ("max_body_bytes", 0), ("max_body_bytes", True), ("max_body_bytes", 1.5),
                                           ("plugin_key", "k" * 31), ("plugin_key", "k k" * 11)])
def test_options_of_the_wrong_type_are_refused(option: str, value: Any) -> None:
    err = options_error(lambda: Plugin("parity", **{option: value}))
    assert [d["path"] for d in err.details] == [option]


async def test_a_body_limit_below_1024_bytes_is_taken(api: Api) -> None:
    plugin = new_plugin(api, max_body_bytes=1)
    plugin.tool(lambda: "ok", name="t")
    async with plugin:
        # Every call's body is larger: the callback answers 413, a tool error for the model.
        result = await api.call("t", {})
        assert result["is_error"] is True


async def test_a_callback_port_in_use_is_a_plugin_error_and_nothing_stays_registered(api: Api) -> None:
    assert "TP_ERR_PLUGIN_LISTEN" in PLUGIN_ERROR_CODES
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        plugin = new_plugin(api, port=taken.getsockname()[1])
        plugin.tool(lambda: "ok", name="t")
        with pytest.raises(PluginError) as info:
            await plugin.start()
    assert info.value.code == "TP_ERR_PLUGIN_LISTEN", info.value
    assert "in use" in info.value.message
    assert not plugin.is_running
    assert not [t for t in (await api.tools("default"))["default"] if t["source"] == plugin.source]
    with pytest.raises(PluginError) as again:
        await plugin.start()
    assert again.value.code == "TP_ERR_PLUGIN_STATE"
