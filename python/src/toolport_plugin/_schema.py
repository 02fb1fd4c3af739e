"""Type hints → JSON Schema, argument validation, and JSON → the handler's Python values.

The schema a tool is registered with is built from its function's signature once, when the
decorator runs; every call's arguments are then validated against that same schema (with the
``jsonschema`` package) before the handler runs, and converted to what the annotations ask for
(dataclasses, pydantic models, enums, tuples). One schema serves both the model and the check, so
they cannot drift apart, and an explicitly given schema is checked the same way.
"""
from __future__ import annotations

import dataclasses
import enum
import inspect
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Union

import jsonschema

try:  # pydantic is optional: models are supported when it is installed
    import pydantic
except ImportError:  # pragma: no cover - exercised only where pydantic is absent
    pydantic = None  # type: ignore[assignment]

JsonSchema = dict[str, Any]

_NONE_TYPE = type(None)
_PRIMITIVES: dict[Any, JsonSchema] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    _NONE_TYPE: {"type": "null"},
}
_MAX_DEPTH = 32  # Toolport's default limits.maxParametersDepth


class SchemaError(TypeError):
    """A handler's signature cannot be turned into a JSON Schema (raised by the decorator)."""


class ArgumentsError(ValueError):
    """The call's arguments do not fit the tool's parameters; the message is for the model."""


def _is_pydantic_model(tp: Any) -> bool:
    return pydantic is not None and isinstance(tp, type) and issubclass(tp, pydantic.BaseModel)


def _is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


class _Builder:
    """Builds one tool's schema; pydantic models' shared definitions are hoisted into ``$defs``."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.defs: dict[str, JsonSchema] = {}

    def schema(self, tp: Any, depth: int = 0) -> JsonSchema:
        if depth > _MAX_DEPTH:
            raise SchemaError(f"{self.where}: the type nests deeper than {_MAX_DEPTH} levels (a recursive type?)")
        if tp is Any or tp is inspect.Parameter.empty or tp is object:
            return {}
        if tp in _PRIMITIVES:
            return dict(_PRIMITIVES[tp])
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if origin is typing.Annotated:
            inner = self.schema(args[0], depth + 1)
            for meta in args[1:]:
                if isinstance(meta, str):
                    inner = {**inner, "description": meta}
            return inner
        if origin is Literal:
            values = list(args)
            out: JsonSchema = {"enum": values}
            kinds = {type(v) for v in values}
            if len(kinds) == 1 and next(iter(kinds)) in _PRIMITIVES:
                out = {**_PRIMITIVES[next(iter(kinds))], "enum": values}
            return out
        if origin is Union or origin is types.UnionType:
            members = [a for a in args if a is not _NONE_TYPE]
            choices = [self.schema(a, depth + 1) for a in members]
            if len(members) < len(args):
                choices.append({"type": "null"})
            return choices[0] if len(choices) == 1 else {"anyOf": choices}
        if origin in (list, set, frozenset, Sequence) or tp in (list, set, frozenset):
            out = {"type": "array"}
            if args:
                out["items"] = self.schema(args[0], depth + 1)
            if origin in (set, frozenset) or tp in (set, frozenset):
                out["uniqueItems"] = True
            return out
        if origin is tuple or tp is tuple:
            if len(args) == 2 and args[1] is Ellipsis:
                return {"type": "array", "items": self.schema(args[0], depth + 1)}
            if not args:
                return {"type": "array"}
            items = [self.schema(a, depth + 1) for a in args]
            # prefixItems is draft 2020-12 (checked here); Toolport's draft-07 check sees the length.
            return {"type": "array", "prefixItems": items, "minItems": len(items), "maxItems": len(items)}
        if origin in (dict, Mapping) or tp is dict:
            if args and args[0] is not str:
                raise SchemaError(f"{self.where}: JSON object keys are strings; {tp!r} has other keys")
            out = {"type": "object"}
            if len(args) == 2:
                out["additionalProperties"] = self.schema(args[1], depth + 1)
            return out
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return {"enum": [member.value for member in tp]}
        if _is_pydantic_model(tp):
            return self._pydantic(tp)
        if _is_typeddict(tp):
            hints = typing.get_type_hints(tp, include_extras=True)
            props = {k: self.schema(v, depth + 1) for k, v in hints.items()}
            required = [k for k in hints if k in tp.__required_keys__]
            return _object(props, required, closed=True, title=tp.__name__)
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            hints = typing.get_type_hints(tp, include_extras=True)
            props, required = {}, []
            for field in dataclasses.fields(tp):
                if not field.init:
                    continue
                props[field.name] = self.schema(hints.get(field.name, Any), depth + 1)
                if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                    required.append(field.name)
                elif field.default is not dataclasses.MISSING and _is_json(field.default):
                    props[field.name]["default"] = field.default
            return _object(props, required, closed=True, title=tp.__name__)
        raise SchemaError(f"{self.where}: no JSON Schema for the type {tp!r}; annotate with a JSON type, or give parameters=")

    def _pydantic(self, model: Any) -> JsonSchema:
        schema = model.model_json_schema(ref_template="#/$defs/{model}")
        for name, definition in schema.pop("$defs", {}).items():
            if name in self.defs and self.defs[name] != definition:
                raise SchemaError(f"{self.where}: two different models are both named {name!r}")
            self.defs[name] = definition
        return schema


def _object(props: JsonSchema, required: list[str], *, closed: bool, title: str | None = None) -> JsonSchema:
    out: JsonSchema = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    if closed:
        out["additionalProperties"] = False
    if title is not None:
        out["title"] = title
    return out


def _is_json(value: Any) -> bool:
    if value is None or isinstance(value, (str, bool, int, float)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_is_json(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    return False


class Signature:
    """What the server needs to call one handler: its schema, validator and argument converter."""

    def __init__(self, fn: Callable[..., Any], name: str, parameters: JsonSchema | None, context_type: type) -> None:
        where = f"tool {name!r} ({getattr(fn, '__qualname__', fn)!r})"
        sig = inspect.signature(fn)
        try:
            hints = typing.get_type_hints(fn, include_extras=True)
        except Exception as err:  # an annotation that names something undefined
            raise SchemaError(f"{where}: cannot resolve its type hints: {err}") from err
        self.context_param: str | None = None
        self.accepts_var_kwargs = False
        self.types: dict[str, Any] = {}
        params: list[inspect.Parameter] = []
        for p in sig.parameters.values():
            tp = hints.get(p.name, p.annotation)
            if tp is context_type or (typing.get_origin(tp) in (Union, types.UnionType)
                                      and context_type in typing.get_args(tp)):  # CallContext | None
                self.context_param = p.name
                continue
            if p.kind is inspect.Parameter.VAR_KEYWORD:
                self.accepts_var_kwargs = True
                continue
            if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL):
                raise SchemaError(f"{where}: parameter {p.name!r} cannot be passed by name; tools take keyword arguments")
            params.append(p)
            self.types[p.name] = tp

        if parameters is not None:
            if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
                raise SchemaError(f"{where}: parameters must be a JSON Schema object with type 'object'")
            self.schema: JsonSchema = parameters
            # With an explicit schema the arguments are passed as they came, by name.
            self.types = {}
            self.accepts_var_kwargs = True
        else:
            builder = _Builder(where)
            props: JsonSchema = {}
            required: list[str] = []
            for p in params:
                props[p.name] = builder.schema(self.types[p.name])
                if p.default is inspect.Parameter.empty:
                    required.append(p.name)
                elif _is_json(p.default):
                    props[p.name] = {**props[p.name], "default": p.default}
            self.schema = _object(props, required, closed=not self.accepts_var_kwargs)
            if builder.defs:
                self.schema["$defs"] = builder.defs
        try:
            jsonschema.Draft202012Validator.check_schema(self.schema)
        except jsonschema.SchemaError as err:
            raise SchemaError(f"{where}: the parameters are not a valid JSON Schema: {err.message}") from err
        self._validator = jsonschema.Draft202012Validator(self.schema)

    def arguments(self, raw: Any) -> dict[str, Any]:
        """Validates a call's arguments and converts them to the handler's keyword arguments."""
        if not isinstance(raw, dict):
            raise ArgumentsError("arguments must be a JSON object")
        problems = sorted(self._validator.iter_errors(raw), key=lambda e: list(e.absolute_path))
        if problems:
            raise ArgumentsError("; ".join(_describe(e) for e in problems[:10]))
        out: dict[str, Any] = {}
        for key, value in raw.items():
            tp = self.types.get(key)
            out[key] = value if tp is None else _convert(value, tp, key)
        return out


def _describe(error: jsonschema.ValidationError) -> str:
    path = "/".join(str(p) for p in error.absolute_path)
    return f"{path or '(arguments)'}: {error.message}"


def _convert(value: Any, tp: Any, path: str) -> Any:
    """JSON value (already valid for the schema) → the annotated Python type."""
    if tp is Any or tp is inspect.Parameter.empty or value is None:
        return value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _convert(value, args[0], path)
    if origin is Union or origin is types.UnionType:
        # The first member whose schema the value fits decides (as anyOf did).
        for member in args:
            if member is _NONE_TYPE:
                continue
            try:
                jsonschema.validate(value, _Builder(path).schema(member), cls=jsonschema.Draft202012Validator)
            except (jsonschema.ValidationError, SchemaError):
                continue
            return _convert(value, member, path)
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    if _is_pydantic_model(tp):
        try:
            return tp.model_validate(value)
        except pydantic.ValidationError as err:
            raise ArgumentsError(f"{path}: {err}") from err
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        hints = typing.get_type_hints(tp, include_extras=True)
        return tp(**{k: _convert(v, hints.get(k, Any), f"{path}/{k}") for k, v in value.items()})
    if _is_typeddict(tp):
        hints = typing.get_type_hints(tp, include_extras=True)
        return {k: _convert(v, hints.get(k, Any), f"{path}/{k}") for k, v in value.items()}
    if origin in (list, Sequence) and args:
        return [_convert(v, args[0], f"{path}/{i}") for i, v in enumerate(value)]
    if origin in (set, frozenset):
        items = (_convert(v, args[0], path) for v in value) if args else iter(value)
        return origin(items)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(v, args[0], f"{path}/{i}") for i, v in enumerate(value))
        return tuple(_convert(v, a, f"{path}/{i}") for i, (v, a) in enumerate(zip(value, args)))
    if origin in (dict, Mapping) and len(args) == 2:
        return {k: _convert(v, args[1], f"{path}/{k}") for k, v in value.items()}
    return value


def to_json_value(value: Any) -> Any:
    """A handler's return value → plain JSON data (dataclasses and pydantic models included)."""
    if _is_pydantic_model(type(value)):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json_value(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return to_json_value(value.value)
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): to_json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_json_value(v) for v in value]
    return value
