"""Type hints → JSON Schema, argument validation, and JSON → the handler's Python values.

The schema a tool is registered with is built from its function's signature once, when the
decorator runs; every call's arguments are then validated against that same schema (with the
``jsonschema`` package) before the handler runs, and converted to what the annotations ask for
(dataclasses, pydantic models, enums, tuples). One schema serves both the model and the check, so
they cannot drift apart.

An explicitly given schema is held to Toolport's rules when declared (``_toolport_schema``), and
its arguments reach the handler as Toolport delivers them: Toolport validated them against that
very schema before the call (docs/protocol.md R9), with the schema's dialect and RE2, the engine
whose verdict counts.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, Union

import jsonschema

from ._json import encode
from ._toolport_schema import not_json, problems, re2_problem, validator_class

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

# A TypedDict's key qualifiers (`Required[int]`, `NotRequired[str]`, `ReadOnly[...]`), by name:
# which keys are required comes from them or the class's totality; the schema and the value are the
# inner type's. typing has them from 3.11 (ReadOnly from 3.13); typing_extensions spells its own.
_QUALIFIER_NAMES = ("Required", "NotRequired", "ReadOnly")
_QUALIFIER_MODULES: list[Any] = [typing]
try:
    import typing_extensions
except ImportError:  # pragma: no cover - pydantic depends on it; without both only typing's count
    pass
else:
    _QUALIFIER_MODULES.append(typing_extensions)
_QUALIFIER_NAME: dict[Any, str] = {
    q: n for m in _QUALIFIER_MODULES for n in _QUALIFIER_NAMES if (q := getattr(m, n, None)) is not None}
_KEY_QUALIFIERS = tuple(_QUALIFIER_NAME)


class SchemaError(TypeError):
    """A handler's signature cannot be turned into a JSON Schema (raised by the decorator)."""


class ArgumentsError(ValueError):
    """The call's arguments do not fit the tool's parameters; the message is for the model."""


def _is_pydantic_model(tp: Any) -> bool:
    return pydantic is not None and isinstance(tp, type) and issubclass(tp, pydantic.BaseModel)


def _is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


def _typeddict_key_required(tp: Any, key: str, hint: Any) -> bool:
    """Whether a TypedDict's key is required: a `Required`/`NotRequired` on its resolved hint, else
    the class's verdict. Python 3.11 reads the qualifier only from a real annotation, so under
    `from __future__ import annotations` its __required_keys__ holds every key of a total class."""
    while True:
        origin = typing.get_origin(hint)
        name = _QUALIFIER_NAME.get(origin) if origin is not None else None
        if name == "Required":
            return True
        if name == "NotRequired":
            return False
        if origin is not typing.Annotated and name != "ReadOnly":
            return key in tp.__required_keys__
        hint = typing.get_args(hint)[0]


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
        if origin in _KEY_QUALIFIERS:
            return self.schema(args[0], depth)
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
            required = [k for k, v in hints.items() if _typeddict_key_required(tp, k, v)]
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
        schema: JsonSchema = model.model_json_schema(ref_template="#/$defs/{model}")
        # pydantic checks every value itself; a pattern Toolport cannot run (pydantic's own Decimal
        # has a lookahead), or a format that refuses what pydantic takes, would only get in the way.
        _remove_what_toolport_would_refuse(schema)
        defs: dict[str, Any] = schema.pop("$defs", {})
        # Another parameter's model of the same name (from another module) that differs: this
        # model's one is renamed, as pydantic itself tells them apart within one model.
        renames: dict[str, str] = {}
        for name, definition in defs.items():
            if name in self.defs and self.defs[name] != definition:
                # The same model under a name given it before (a third parameter nesting it again).
                n = 2
                while f"{name}_{n}" in defs or (f"{name}_{n}" in self.defs and self.defs[f"{name}_{n}"] != definition):
                    n += 1
                renames[f"#/$defs/{name}"] = f"#/$defs/{name}_{n}"
        if renames:
            _rename_refs([schema, *defs.values()], renames)
            defs = {renames.get(f"#/$defs/{k}", f"#/$defs/{k}")[len("#/$defs/"):]: v for k, v in defs.items()}
        self.defs.update(defs)
        return schema


# Keywords whose value is a subschema, a list of them, or a mapping of names to them.
_ONE_SCHEMA = ("additionalProperties", "items", "additionalItems", "contains", "propertyNames", "not", "if", "then",
               "else", "unevaluatedItems", "unevaluatedProperties")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def _subschemas(*roots: Any) -> Iterator[dict[str, Any]]:
    """``roots`` and each of their subschemas, reached through the keywords above only (never a
    ``default``, ``examples`` or ``const`` value)."""
    work: list[Any] = list(roots)
    while work:
        node = work.pop()
        if not isinstance(node, dict):
            continue
        yield node
        work.extend(node.get(key) for key in _ONE_SCHEMA)
        for key in _SCHEMA_LISTS:
            if isinstance(node.get(key), list):
                work.extend(node[key])
        for key in _SCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                work.extend(node[key].values())


def _rename_refs(schemas: list[Any], renames: dict[str, str]) -> None:
    """Points each ``$ref`` of ``schemas`` (and their subschemas) named in ``renames`` at its new name."""
    for node in _subschemas(*schemas):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref in renames:
            node["$ref"] = renames[ref]


# pydantic writes these for ``datetime.time``, ``datetime.datetime`` and ``datetime.timedelta``,
# which take what the formats (as Toolport checks them) refuse: a time without a UTC offset
# (``12:30:00``, ``2024-01-01T12:00:00``), a duration as ``PT0.5S`` (its own JSON) or ``01:00:00``.
_FORMATS_PYDANTIC_EXCEEDS = ("time", "date-time", "duration")


def _remove_what_toolport_would_refuse(schema: JsonSchema) -> None:
    """Removes, in place, from a schema pydantic generated, each ``pattern`` RE2 surely refuses and
    each ``format`` above: Toolport would refuse the tool, or what the model means."""
    for node in _subschemas(schema):
        pattern = node.get("pattern")
        if isinstance(pattern, str) and re2_problem(pattern) is not None:
            del node["pattern"]
        if node.get("format") in _FORMATS_PYDANTIC_EXCEEDS:
            del node["format"]


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
    """Whether a Python default can be shown to the model as it is (a NaN, a set… is not)."""
    return not_json(value) is None


class Signature:
    """What the server needs to call one handler: its schema, validator and argument converter."""

    def __init__(self, fn: Callable[..., Any], name: str, parameters: JsonSchema | None, context_type: type) -> None:
        where = f"tool {name!r} ({getattr(fn, '__qualname__', None) or type(fn).__qualname__!r})"
        annotated, fixed = _annotated(fn)
        try:
            # A callable object's __call__ without self, a partial's parameters it leaves open.
            sig = inspect.signature(fn)
        except (TypeError, ValueError) as err:  # a builtin without one, …
            raise SchemaError(f"{where}: cannot read its signature: {err}") from err
        try:
            hints = typing.get_type_hints(annotated, include_extras=True)
        except Exception as err:  # an annotation that names something undefined
            raise SchemaError(f"{where}: cannot resolve its type hints: {err}") from err
        self.context_param: str | None = None
        self.accepts_var_kwargs = False
        self.types: dict[str, Any] = {}
        #: Keyword arguments a functools.partial fixed: the program's, not the model's.
        self.fixed = fixed
        params: list[inspect.Parameter] = []
        for p in sig.parameters.values():
            if p.name in fixed:
                continue
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

        self._validator: Any = None
        if parameters is not None:
            if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
                raise SchemaError(f"{where}: parameters must be a JSON Schema object with type 'object'")
            cls, problem = validator_class(parameters)
            if cls is None:
                raise SchemaError(f"{where}: {problem}")
            _check_toolport_rules(where, parameters, cls)
            self.schema: JsonSchema = parameters
            # With an explicit schema the arguments are passed as they came, by name. Toolport
            # checked them against this very schema before the call (docs/protocol.md R9), with
            # its dialect and RE2; a second check here could only refuse what Toolport accepted
            # (Python's `re` reads \S or \b otherwise, and 9007199254740993 > 2**53 for an int).
            self.types = {}
            self.accepts_var_kwargs = True
            if self.context_param is not None and self.context_param in (parameters.get("properties") or {}):
                raise SchemaError(f"{where}: the parameters name the argument {self.context_param!r}, which is the "
                                  "handler's CallContext parameter; rename one of them")
            named_fixed = sorted(fixed & set(parameters.get("properties") or {}))
            if named_fixed:
                raise SchemaError(f"{where}: the parameters name {', '.join(map(repr, named_fixed))}, which the "
                                  "functools.partial fixes; leave them out")
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
            _check_toolport_rules(where, self.schema, jsonschema.Draft202012Validator)
            # The schema from the type hints is the SDK's own (2020-12, no patterns but a pydantic
            # model's): checked again here, as the conversions below rely on it.
            self._validator = _HintsValidator(self.schema)

    def arguments(self, raw: Any) -> dict[str, Any]:
        """Validates a call's arguments (against the schema from type hints) and converts them to
        the handler's keyword arguments; ``ArgumentsError`` names what is wrong."""
        try:
            return self._arguments(raw)
        except RecursionError:  # the check or the conversion of arguments nested past the stack
            raise ArgumentsError("they nest too deeply to be checked against the tool's type hints") from None

    def _arguments(self, raw: Any) -> dict[str, Any]:
        if not isinstance(raw, dict):
            raise ArgumentsError("arguments must be a JSON object")
        if self._validator is not None:
            problems = sorted(self._validator.iter_errors(raw), key=lambda e: list(e.absolute_path))
            if problems:
                raise ArgumentsError("; ".join(_describe(e) for e in problems[:10]))
        if self.context_param is not None and self.context_param in raw:
            # Only with **kwargs (an open schema): the handler cannot receive both.
            raise ArgumentsError(f"{self.context_param}: this argument cannot be passed (the tool's "
                                 "handler receives its call context under that name)")
        overriding = sorted(self.fixed.intersection(raw))
        if overriding:
            # Only with **kwargs (an open schema): the model must not replace what the program fixed.
            raise ArgumentsError(f"{', '.join(overriding)}: cannot be passed (the tool fixes it)")
        out: dict[str, Any] = {}
        for key, value in raw.items():
            tp = self.types.get(key)
            if tp is None:
                out[key] = value
                continue
            try:
                out[key] = _convert(value, tp, key)
            except (ArgumentsError, RecursionError):
                raise
            except Exception as err:  # user code on the way (an Enum's _missing_, …): the model's to fix
                raise ArgumentsError(f"{key}: {_refusal(err)}") from err
        return out


def _annotated(fn: Callable[..., Any]) -> tuple[Callable[..., Any], frozenset[str]]:
    """The function whose annotations type ``fn``'s parameters, and the keyword arguments
    ``functools.partial``s fixed on the way to it. A callable object's are on its ``__call__``;
    ``typing.get_type_hints`` on the instance reads the class's attribute annotations instead."""
    fixed: set[str] = set()
    while isinstance(fn, functools.partial):
        fixed.update(fn.keywords)
        fn = fn.func
    if not inspect.isroutine(fn) and not inspect.isclass(fn) and callable(fn):
        fn = type(fn).__call__
    return fn, frozenset(fixed)


def _check_toolport_rules(where: str, schema: JsonSchema, cls: Any) -> None:
    """Raises SchemaError for what Toolport would surely refuse in ``schema`` at registration
    (docs/protocol.md R7; see _toolport_schema)."""
    problem = not_json(schema)
    if problem is not None:
        raise SchemaError(f"{where}: {problem}")
    found = problems(schema, cls)
    if found:
        raise SchemaError(f"{where}: " + "; ".join(found[:5]))


def _describe(error: jsonschema.ValidationError) -> str:
    path = "/".join(str(p) for p in error.absolute_path)
    return f"{path or '(arguments)'}: {error.message}"


def _validate_model(model: Any, value: Any) -> Any:
    """The arguments are JSON, so pydantic reads them in JSON mode: a strict model (or field) takes a
    datetime, UUID or Enum as its string and a tuple as an array there, and refuses them as Python
    objects. Text its JSON parser refuses (a lone surrogate, which JSON allows as an escape) is
    read in Python mode instead."""
    try:
        return model.model_validate_json(encode(value))
    except pydantic.ValidationError as err:
        if any(e["type"] != "json_invalid" for e in err.errors()):
            raise
    return model.model_validate(value)


def _convert(value: Any, tp: Any, path: str) -> Any:
    """JSON value (already valid for the schema) → the annotated Python type."""
    if tp is Any or tp is inspect.Parameter.empty or value is None:
        return value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated or origin in _KEY_QUALIFIERS:
        return _convert(value, args[0], path)
    if origin is Union or origin is types.UnionType:
        # The first member whose schema the value fits, and that converts it, decides (as anyOf
        # did). A member's own checks the schema check leaves to it (a pydantic pattern) may refuse
        # the value: the next member is tried, and the last refusal is the answer if none takes it.
        refused: ArgumentsError | None = None
        for member in args:
            if member is _NONE_TYPE:
                continue
            validator = _member_validator(member)
            if validator is not None and validator.is_valid(value):
                try:
                    return _convert(value, member, path)
                except ArgumentsError as err:
                    refused = err
        if refused is not None:
            raise refused
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, float):
        # JSON Schema's integer includes 2.0 and 1e21 (json reads both as floats): an int arrives.
        return int(value)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    if _is_pydantic_model(tp):
        try:
            return _validate_model(tp, value)
        except pydantic.ValidationError as err:
            raise ArgumentsError(f"{path}: {err}") from err
        except Exception as err:  # a validator raising what pydantic does not wrap (a KeyError, …)
            raise ArgumentsError(f"{path}: {_refusal(err)}") from err
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        hints = typing.get_type_hints(tp, include_extras=True)
        fields = {k: _convert(v, hints.get(k, Any), f"{path}/{k}") for k, v in value.items()}
        try:
            return tp(**fields)
        except Exception as err:  # its __post_init__ refusing the values: the model's to fix
            raise ArgumentsError(f"{path}: {_refusal(err)}") from err
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


def _refusal(err: Exception) -> str:
    """The model's text for an exception the conversion of arguments raised: a ValueError's or
    an AssertionError's message (the usual way to refuse a value), else its type and message."""
    text = str(err)
    if isinstance(err, (ValueError, AssertionError)) and text:
        return text
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


# Union members' validators, built once per member type: a call whose argument is a union is
# converted by the first member its value fits, and building a member's schema and validator per
# call would cost more than the call. Bounded; an unhashable member (an Annotated with a list in
# it) is built each time.
_MEMBER_VALIDATORS: dict[Any, Any] = {}
_MAX_MEMBER_VALIDATORS = 1024


def _member_validator(member: Any) -> Any:
    """A validator of ``member``'s schema with its ``$defs`` (a pydantic model's nested models and
    enums are ``$ref``s into them), or None for a type with no schema."""
    try:
        return _MEMBER_VALIDATORS[member]
    except KeyError:
        hashable = True
    except TypeError:
        hashable = False
    builder = _Builder("a union member")
    try:
        schema = builder.schema(member)
    except SchemaError:
        validator = None
    else:
        if builder.defs:
            schema = {**schema, "$defs": builder.defs}
        validator = _HintsValidator(schema)
    if hashable and len(_MEMBER_VALIDATORS) < _MAX_MEMBER_VALIDATORS:
        _MEMBER_VALIDATORS[member] = validator
    return validator


def _checked_by_pydantic(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
    """``pattern`` and ``patternProperties`` in a schema built from type hints come from pydantic
    models only, and pydantic checks them itself, with its linear-time regular expressions, when it
    converts the arguments. jsonschema would check them with Python's ``re``, which backtracks: one
    argument of 28 characters against ``(a*)*b`` stalled the whole plugin for seconds."""
    return iter(())


# The type hints' own schema, checked without Python's backtracking regular expressions.
_HintsValidator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator, {"pattern": _checked_by_pydantic, "patternProperties": _checked_by_pydantic})


_LEAVE = object()  # to_json_value's work item that ends a container


def to_json_value(value: Any) -> Any:
    """A handler's return value → plain JSON data (dataclasses and pydantic models included).

    Walks with a stack of its own, so an output of any depth converts (docs/protocol.md R10: the
    TypeScript SDK and Toolport carry them); a container met again inside itself is a cycle, which
    JSON cannot carry (``ValueError``). Values it does not know are left for the encoder to refuse.
    """
    root: list[Any] = [None]
    # The containers between the root and the item at hand, by id; `made` keeps the dicts made
    # here (a dataclass's fields, a model's dump) alive, so their ids are not reused meanwhile.
    on_path: set[int] = set()
    made: list[Any] = []
    work: list[tuple[Any, Any]] = [(value, (root, 0))]
    while work:
        item, slot = work.pop()
        if item is _LEAVE:
            on_path.discard(slot)
            continue
        while isinstance(item, enum.Enum):
            item = item.value
        if _is_pydantic_model(type(item)):
            item = item.model_dump(mode="json", by_alias=True)
            made.append(item)
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            if id(item) in on_path:
                raise ValueError("Circular reference detected")
            on_path.add(id(item))
            work.append((_LEAVE, id(item)))
            item = {f.name: getattr(item, f.name) for f in dataclasses.fields(item)}
            made.append(item)
        container, key = slot
        if isinstance(item, (dict, list, tuple, set, frozenset)):
            if id(item) in on_path:
                raise ValueError("Circular reference detected")
            on_path.add(id(item))
            work.append((_LEAVE, id(item)))
            if isinstance(item, dict):
                members: dict[str, Any] = {}
                container[key] = members
                for k, v in item.items():
                    name = k if isinstance(k, str) else str(k)
                    members[name] = None
                    work.append((v, (members, name)))
            else:
                items = list(item)
                converted: list[Any] = [None] * len(items)
                container[key] = converted
                for index, v in enumerate(items):
                    work.append((v, (converted, index)))
        else:
            container[key] = item
    return root[0]
