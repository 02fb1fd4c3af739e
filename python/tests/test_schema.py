"""Type hints → JSON Schema, argument conversion and reply encoding, without a server."""
from __future__ import annotations

import datetime
import enum
import functools
import json
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Optional, TypedDict, Union

import pydantic
import pytest
from typing_extensions import NotRequired, Required  # typing's from 3.11; the package runs on 3.10

from toolport_plugin import CallContext, Image, Plugin, PluginError, ToolError, ToolOutput
from toolport_plugin._results import exception_reply, output_reply
from toolport_plugin._schema import ArgumentsError

from .models import Span


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Point(TypedDict):
    x: int
    y: int


@dataclass
class Box:
    corner: Point
    size: float
    tags: list[str] = field(default_factory=list)


class Inner(pydantic.BaseModel):
    n: int


class Outer(pydantic.BaseModel):
    inner: Inner
    label: str = "x"


def schema_of(fn: Any, **options: Any) -> tuple[dict[str, Any], Any]:
    plugin = Plugin("schema")
    plugin.tool(fn, **options)
    tool = plugin.tools[fn.__name__]
    return tool.parameters, tool.signature


def test_scalars_literals_optionals_and_containers_map_to_json_schema() -> None:
    def f(a: int, b: float, c: bool, d: str, e: Literal[1, 2], f: Optional[str], g: list[int], h: dict[str, float],
          i: tuple[int, str], j: Union[int, str], k: Color, m: Annotated[str, "a city name"] = "Oslo",
          ctx: CallContext = None) -> None:  # type: ignore[assignment]
        pass

    schema, _ = schema_of(f)
    p = schema["properties"]
    assert p["a"] == {"type": "integer"}
    assert p["b"] == {"type": "number"}
    assert p["c"] == {"type": "boolean"}
    assert p["d"] == {"type": "string"}
    assert p["e"] == {"type": "integer", "enum": [1, 2]}
    assert p["f"] == {"anyOf": [{"type": "string"}, {"type": "null"}]}
    assert p["g"] == {"type": "array", "items": {"type": "integer"}}
    assert p["h"] == {"type": "object", "additionalProperties": {"type": "number"}}
    assert p["i"]["minItems"] == p["i"]["maxItems"] == 2
    assert p["j"] == {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    assert p["k"] == {"enum": ["red", "blue"]}
    assert p["m"] == {"type": "string", "description": "a city name", "default": "Oslo"}
    assert "ctx" not in p  # the context is injected, never asked of the model

    def g(x: int, ctx: Optional[CallContext] = None) -> None:
        pass

    g_schema, g_sig = schema_of(g)
    assert list(g_schema["properties"]) == ["x"]
    assert g_sig.context_param == "ctx"
    assert schema["required"] == ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k"]
    assert schema["additionalProperties"] is False


def test_typeddicts_dataclasses_and_pydantic_models_are_objects_and_arrive_as_themselves() -> None:
    def f(box: Box, outer: Outer, color: Color = Color.RED, scale: float = 1.0) -> None:
        pass

    schema, sig = schema_of(f)
    box = schema["properties"]["box"]
    assert box["required"] == ["corner", "size"]
    assert box["properties"]["corner"]["required"] == ["x", "y"]
    # pydantic's shared definitions are hoisted to the top, where its $refs point.
    assert "Inner" in schema["$defs"]
    assert schema["properties"]["outer"]["properties"]["inner"] == {"$ref": "#/$defs/Inner"}

    args = sig.arguments({"box": {"corner": {"x": 1, "y": 2}, "size": 3}, "outer": {"inner": {"n": 4}}, "color": "blue", "scale": 2})
    assert args["box"] == Box(corner={"x": 1, "y": 2}, size=3.0)
    assert args["outer"] == Outer(inner=Inner(n=4))
    assert args["color"] is Color.BLUE
    assert args["scale"] == 2.0 and isinstance(args["scale"], float)

    with pytest.raises(ArgumentsError) as info:
        sig.arguments({"box": {"corner": {"x": "1"}, "size": 3}, "outer": {"inner": {}}})
    message = str(info.value)
    assert "box/corner/x: '1' is not of type 'integer'" in message
    assert "box/corner: 'y' is a required property" in message
    assert "outer/inner: 'n' is a required property" in message


class Shade(pydantic.BaseModel):
    color: Color


def test_an_optional_or_union_model_with_defs_arrives_as_the_model() -> None:
    # The member's schema holds $refs into the tool's $defs (a nested model, an Enum): the union's
    # choice must resolve them, or no member fits.
    def f(outer: Optional[Outer] = None, shade: Shade | None = None, shades: list[Shade] | None = None,
          either: Union[Outer, int] = 0) -> None:
        pass

    schema, sig = schema_of(f)
    assert {"Inner", "Color"} <= set(schema["$defs"])
    args = sig.arguments({"outer": {"inner": {"n": 1}}, "shade": {"color": "blue"}, "shades": [{"color": "red"}],
                          "either": {"inner": {"n": 2}}})
    assert args["outer"] == Outer(inner=Inner(n=1))
    assert args["shade"] == Shade(color=Color.BLUE)
    assert args["shades"] == [Shade(color=Color.RED)]
    assert args["either"] == Outer(inner=Inner(n=2))
    assert sig.arguments({"either": 3, "outer": None}) == {"either": 3, "outer": None}


class StrictEvent(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(strict=True)
    when: datetime.datetime
    id: uuid.UUID
    color: Color
    pair: tuple[int, int]


class StrictField(pydantic.BaseModel):
    day: datetime.date = pydantic.Field(strict=True)
    count: int = pydantic.Field(strict=True)


def test_a_strict_pydantic_model_takes_its_arguments_as_json_as_pydantic_reads_json() -> None:
    # Arguments are JSON: a strict model must judge them as pydantic's JSON mode does (a datetime,
    # UUID or Enum as its string, a tuple as an array), or no argument could ever reach it.
    def f(event: StrictEvent, field: StrictField) -> None:
        pass

    _, sig = schema_of(f)
    args = sig.arguments({"event": {"when": "2024-01-01T00:00:00Z", "id": "12345678-1234-5678-1234-567812345678",
                                    "color": "red", "pair": [1, 2]},
                          "field": {"day": "2024-02-29", "count": 3}})
    assert args["event"] == StrictEvent(when=datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc),
                                        id=uuid.UUID("12345678-1234-5678-1234-567812345678"), color=Color.RED, pair=(1, 2))
    assert args["field"] == StrictField(day=datetime.date(2024, 2, 29), count=3)
    # Strictness still holds where the schema check lets a value by: 3.0 is a JSON Schema integer,
    # and a strict int field refuses it.
    with pytest.raises(ArgumentsError) as info:
        sig.arguments({"event": {"when": "2024-01-01T00:00:00Z", "id": "12345678-1234-5678-1234-567812345678",
                                 "color": "red", "pair": [1, 2]},
                       "field": {"day": "2024-02-29", "count": 3.0}})
    assert str(info.value).startswith("field: ") and "count" in str(info.value), str(info.value)


def test_an_int_parameter_gets_an_int_for_json_integers_written_as_floats() -> None:
    # 2.0 and 1e21 are integers to JSON Schema, and json reads them as floats.
    def f(n: int, ns: list[int], maybe: Optional[int] = None) -> None:
        pass

    _, sig = schema_of(f)
    args = sig.arguments(json.loads('{"n": 1e21, "ns": [2.0, 3], "maybe": -4.0}'))
    assert args == {"n": 10**21, "ns": [2, 3], "maybe": -4}
    assert all(type(v) is int for v in [args["n"], *args["ns"], args["maybe"]])


BillingAddress = pydantic.create_model("Address", __module__="billing", street=(str, ...))
ShippingAddress = pydantic.create_model("Address", __module__="shipping", street=(str, ...), dock=(int, ...))


class Bill(pydantic.BaseModel):
    to: BillingAddress  # type: ignore[valid-type]


class Ship(pydantic.BaseModel):
    to: ShippingAddress  # type: ignore[valid-type]


def test_two_parameters_whose_models_nest_different_models_of_one_name_each_get_their_own() -> None:
    # pydantic names each model's nested Address "Address": the second is renamed, not refused.
    def f(bill: Bill, ship: Ship, ship_too: Ship) -> None:
        pass

    schema, sig = schema_of(f)
    # The same model nested again shares the name it was given.
    assert schema["properties"]["ship_too"]["properties"]["to"] == {"$ref": "#/$defs/Address_2"}
    assert "Address_3" not in schema["$defs"]
    assert schema["properties"]["bill"]["properties"]["to"] == {"$ref": "#/$defs/Address"}
    assert schema["properties"]["ship"]["properties"]["to"] == {"$ref": "#/$defs/Address_2"}
    assert schema["$defs"]["Address_2"]["required"] == ["street", "dock"]
    ship = {"to": {"street": "b", "dock": 4}}
    args = sig.arguments({"bill": {"to": {"street": "a"}}, "ship": ship, "ship_too": ship})
    assert args["ship"].to.dock == 4
    with pytest.raises(ArgumentsError) as info:
        sig.arguments({"bill": {"to": {"street": "a"}}, "ship": {"to": {"street": "b"}}, "ship_too": ship})
    assert "ship/to: 'dock' is a required property" in str(info.value)


class Text(pydantic.BaseModel):
    text: str


def test_a_lone_surrogate_in_a_models_arguments_reaches_it() -> None:
    # JSON allows it as an escape, and pydantic's JSON parser refuses it: Python mode reads it.
    def f(t: Text) -> None:
        pass

    _, sig = schema_of(f)
    assert sig.arguments({"t": {"text": "a\udfffb"}})["t"] == Text(text="a\udfffb")


class Keys(TypedDict):
    a: int
    b: "NotRequired[Annotated[str, 'a label']]"


class OpenKeys(TypedDict, total=False):
    a: "Required[Color]"
    b: int


def test_typeddict_required_and_notrequired_keys() -> None:
    def f(keys: Keys, open_keys: OpenKeys) -> None:
        pass

    schema, sig = schema_of(f)
    keys = schema["properties"]["keys"]
    assert keys["properties"] == {"a": {"type": "integer"}, "b": {"type": "string", "description": "a label"}}
    assert keys["required"] == ["a"]
    open_keys = schema["properties"]["open_keys"]
    assert open_keys["properties"]["a"] == {"enum": ["red", "blue"]}
    assert open_keys["required"] == ["a"]
    args = sig.arguments({"keys": {"a": 1}, "open_keys": {"a": "blue", "b": 2}})
    assert args == {"keys": {"a": 1}, "open_keys": {"a": Color.BLUE, "b": 2}}


@dataclass
class Trip:
    span: Span


class Lookup(pydantic.BaseModel):
    key: str

    @pydantic.field_validator("key")
    @classmethod
    def known(cls, value: str) -> str:
        return {"a": "a"}[value]  # a KeyError, which pydantic does not turn into a ValidationError


def test_an_exception_converting_arguments_refuses_them_naming_where() -> None:
    def f(span: Span | None = None, trip: Optional[Trip] = None, lookup: Optional[Lookup] = None) -> None:
        pass

    _, sig = schema_of(f)
    assert sig.arguments({"span": {"lo": 1, "hi": 2}})["span"] == Span(1, 2)
    with pytest.raises(ArgumentsError) as info:
        sig.arguments({"span": {"lo": 5, "hi": 1}})
    assert str(info.value) == "span: lo must be <= hi"
    with pytest.raises(ArgumentsError) as info:
        sig.arguments({"trip": {"span": {"lo": 5, "hi": 1}}})
    assert str(info.value) == "trip/span: lo must be <= hi"
    assert sig.arguments({"lookup": {"key": "a"}})["lookup"] == Lookup(key="a")
    with pytest.raises(ArgumentsError) as info:
        sig.arguments({"lookup": {"key": "zz"}})
    assert str(info.value) == "lookup: KeyError: 'zz'"


def test_an_explicit_schema_is_registered_as_given_and_its_arguments_arrive_as_toolport_sent_them() -> None:
    params = {"type": "object", "properties": {"q": {"type": "string", "minLength": 2}}, "required": ["q"]}

    def f(**kwargs: Any) -> None:
        pass

    schema, sig = schema_of(f, parameters=params)
    assert schema == params
    assert sig.arguments({"q": "ab", "extra": 1}) == {"q": "ab", "extra": 1}
    # Toolport checked them against this schema before calling (docs/protocol.md R9): the SDK
    # does not judge them again by other rules.
    assert sig.arguments({"q": "a"}) == {"q": "a"}
    with pytest.raises(ArgumentsError, match="arguments must be a JSON object"):
        sig.arguments(["q"])


def test_signatures_that_cannot_be_tools_are_refused_when_declared() -> None:
    plugin = Plugin("bad")

    def positional(a: int, /) -> None:
        pass

    def unknown(a: complex) -> None:
        pass

    def keys(a: dict[int, str]) -> None:
        pass

    for fn in (positional, unknown, keys):
        with pytest.raises(PluginError) as info:
            plugin.tool(fn)
        assert info.value.code == "TP_ERR_PLUGIN_OPTIONS"
    with pytest.raises(PluginError):
        plugin.tool(name="x" * 65)(lambda: None)
    with pytest.raises(PluginError):
        plugin.tool(timeout_seconds=301)(lambda: None)


class Greeter:
    """Greets someone."""

    def __init__(self, greeting: str) -> None:
        self.greeting = greeting

    async def __call__(self, who: str, ctx: CallContext, times: int = 1) -> str:
        return " ".join([f"{self.greeting} {who}"] * times)


def test_a_callable_object_and_a_partial_are_typed_by_what_they_call() -> None:
    """python/README.md "Handlers": a callable object's parameters come from its ``__call__``; a
    ``functools.partial``'s from its function, less the keywords it fixes, which no argument may
    replace."""
    plugin = Plugin("callables")
    plugin.tool(Greeter("hi"), name="greet")
    tool = plugin.tools["greet"]
    assert tool.parameters == {"type": "object", "properties": {"who": {"type": "string"}, "times": {"type": "integer", "default": 1}},
                               "required": ["who"], "additionalProperties": False}
    assert (tool.signature.context_param, tool.is_async, tool.description) == ("ctx", True, "Greets someone.")

    def search(query: str, api_key: str, limit: int = 3, **rest: Any) -> list[str]:
        return []

    plugin.tool(functools.partial(search, api_key="k-123"), name="search")
    tool = plugin.tools["search"]
    assert tool.parameters == {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "default": 3}},
                               "required": ["query"]}
    assert tool.is_async is False
    with pytest.raises(ArgumentsError, match="api_key: cannot be passed"):
        tool.signature.arguments({"query": "q", "api_key": "other"})
    with pytest.raises(PluginError, match="fixes"):
        plugin.tool(functools.partial(search, api_key="k"), name="search2",
                    parameters={"type": "object", "properties": {"api_key": {"type": "string"}}})
    with pytest.raises(PluginError) as info:  # no name of its own
        plugin.tool(Greeter("yo"))
    assert info.value.code == "TP_ERR_PLUGIN_OPTIONS"


class Person(pydantic.BaseModel):
    full_name: str = pydantic.Field(alias="fullName")


def test_replies_encode_outputs_images_and_errors() -> None:
    assert json.loads(output_reply(Box(corner={"x": 1, "y": 2}, size=1.5))) == {
        "output": {"corner": {"x": 1, "y": 2}, "size": 1.5, "tags": []}, "is_error": False}
    assert json.loads(output_reply(Outer(inner=Inner(n=1)))) == {"output": {"inner": {"n": 1}, "label": "x"}, "is_error": False}
    assert json.loads(output_reply(None)) == {"output": None, "is_error": False}
    # By alias, the names the model's schema shows the model (its arguments use them too).
    assert json.loads(output_reply(Person(fullName="Ada")))["output"] == {"fullName": "Ada"}
    image = Image.from_bytes(b"\x89PNG", mime="image/png")
    assert json.loads(output_reply([image, image]))["images"] == [{"data_b64": "iVBORw==", "mime": "image/png"}] * 2
    assert json.loads(output_reply(ToolOutput("ok", images=[image])))["output"] == "ok"

    not_json = json.loads(output_reply({"x": float("nan")}))
    assert not_json["is_error"] is True
    assert not_json["error"].startswith("the tool's output could not be encoded as JSON")
    assert json.loads(output_reply(object()))["is_error"] is True

    assert json.loads(exception_reply(ToolError("NO_DATA", output={"a": 1}))) == {"error": "NO_DATA", "output": {"a": 1}, "is_error": True}
    assert json.loads(exception_reply(ToolError("plain"))) == {"error": "plain", "is_error": True}
    assert json.loads(exception_reply(ValueError())) == {"error": "ValueError", "is_error": True}
    with pytest.raises(ValueError):
        Image.from_bytes(b"x", mime="text/plain")
