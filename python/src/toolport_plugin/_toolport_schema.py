"""Toolport's rules for a tool's ``parameters`` (docs/protocol.md R7), checked when a tool is declared.

Toolport refuses at registration a schema it cannot use (422 ``invalid_schema`` or
``unsupported_dialect``). The SDK refuses what is sure to be refused before ``start()``, naming
the problem, and leaves anything else to Toolport's own check (the 422 at ``start()`` names it):

- the dialect comes from ``$schema``: 2020-12 (also without ``$schema``), 2019-09 or draft-07,
  over http or https, with or without the empty fragment (src/shared/json-schema.ts); any other
  ``$schema`` is refused;
- the schema must be JSON: NaN, ±Infinity and ints past a double's range are refused (JSON has no
  such number; Toolport would read another schema than the one written);
- it must be valid against its dialect's meta-schema, as Ajv has it (formats are not asserted
  there, as Toolport does not);
- its regular expressions run on RE2 in Toolport: a ``pattern`` or ``patternProperties`` key that
  uses what RE2 has not (lookaround, backreferences, possessive or doubled repetitions, ``\\Z``…)
  is refused. Python's ``re`` is not the judge: it refuses what RE2 takes (``\\p{L}``) and takes
  what RE2 refuses (``(?=a)``);
- a ``$ref`` must resolve within the schema: Toolport loads no other document;
- an ``enum`` must not be empty (Ajv, Toolport's validator, refuses to compile one).

Only what Toolport surely compiles is checked: the subschemas its validator reaches from the root
and does not skip as always valid (a definition in ``$defs`` nobody refers to, or a
``patternProperties`` key whose schema is ``{}``, is never compiled there, so it is not judged here).
"""
from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

import jsonschema
import jsonschema.exceptions
from jsonschema.protocols import Validator

JsonSchema = dict[str, Any]

_DIALECTS: dict[str, type[Validator]] = {
    "json-schema.org/draft/2020-12/schema": jsonschema.Draft202012Validator,
    "json-schema.org/draft/2019-09/schema": jsonschema.Draft201909Validator,
    "json-schema.org/draft-07/schema": jsonschema.Draft7Validator,
}
_DIALECT_URI = re.compile(r"https?://(.*?)#?")
_DOUBLE_MAX = 1.7976931348623157e308

# Keywords every dialect's validator in Toolport (Ajv) compiles. Ajv compiles no code for a
# subschema without one of its keywords ("always valid", e.g. {} or {"then": {}}), and some
# applicators then skip their own subschemas too; this set is smaller than Ajv's, so a subschema
# counted as compiled here surely is.
_KEYWORDS = frozenset([
    "type", "enum", "const", "pattern", "format", "minLength", "maxLength", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "required", "minProperties", "maxProperties",
    "minItems", "maxItems", "uniqueItems", "properties", "patternProperties", "additionalProperties",
    "propertyNames", "dependencies", "items", "additionalItems", "contains", "not", "anyOf", "oneOf",
    "allOf", "if", "$ref",
])


def validator_class(schema: JsonSchema) -> tuple[type[Validator] | None, str]:
    """The ``jsonschema`` validator class of the dialect ``schema`` declares, or (None, why)."""
    uri = schema.get("$schema")
    if uri is None:
        return jsonschema.Draft202012Validator, ""
    if not isinstance(uri, str):
        return None, "$schema must be a string (a JSON Schema dialect URI)"
    match = _DIALECT_URI.fullmatch(uri)
    cls = None if match is None else _DIALECTS.get(match.group(1))
    if cls is None:
        return None, (f"$schema {uri[:200]!r} is not a dialect Toolport validates; use "
                      "https://json-schema.org/draft/2020-12/schema (or omit $schema), "
                      "https://json-schema.org/draft/2019-09/schema or http://json-schema.org/draft-07/schema#")
    return cls, ""


def not_json(value: Any, root: str = "parameters") -> str | None:
    """Why ``value`` is not JSON data Toolport reads as written (the path and the reason), or
    None. Walks with a stack of its own: any depth, and a cycle is found, not followed."""
    on_path: set[int] = set()
    work: list[tuple[Any, str]] = [(value, root)]
    while work:
        item, path = work.pop()
        if isinstance(item, _Leave):
            on_path.discard(item.id)
        elif isinstance(item, float):
            if not -_DOUBLE_MAX <= item <= _DOUBLE_MAX:
                return f"{path}: {item!r} is not a finite number (JSON has no Infinity or NaN)"
        elif isinstance(item, int) and not isinstance(item, bool):
            if not -_DOUBLE_MAX <= item <= _DOUBLE_MAX:
                return f"{path}: the integer is beyond a double's range (Toolport would read Infinity)"
        elif isinstance(item, (dict, list, tuple)):
            if id(item) in on_path:
                return f"{path}: refers to itself (a cycle is not JSON)"
            on_path.add(id(item))
            work.append((_Leave(id(item)), path))
            if isinstance(item, dict):
                for key, member in item.items():
                    if not isinstance(key, str):
                        return f"{path}: the key {key!r} is not a string"
                    work.append((member, f"{path}.{key}"))
            else:
                work.extend((member, f"{path}[{index}]") for index, member in enumerate(item))
        elif not (item is None or isinstance(item, (str, bool))):
            return f"{path}: a {type(item).__name__} is not a JSON value"
    return None


class _Leave:
    """``not_json``'s work item that ends a container."""

    __slots__ = ("id",)

    def __init__(self, ident: int) -> None:
        self.id = ident


def problems(schema: JsonSchema, cls: type[Validator]) -> list[str]:
    """What Toolport would refuse in ``schema`` (JSON data, of the dialect of ``cls``): its
    meta-schema's verdict first, then the patterns and references of what Toolport compiles."""
    try:
        error = jsonschema.exceptions.best_match(_meta_validator(cls).iter_errors(schema))
    except RecursionError:  # nested past Python's recursion limit: Toolport's depth limit judges it
        return []
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path)
        return [f"not a valid {_dialect_name(cls)} JSON Schema: {'/' + where if where else '(root)'}: {error.message}"]
    found: list[str] = []
    resolvable = not _has_id(schema)
    for subschema, path in _compiled(schema, cls, follow_refs=resolvable):
        pattern = subschema.get("pattern")
        if isinstance(pattern, str):
            problem = re2_problem(pattern)
            if problem is not None:
                found.append(f"{path}.pattern {pattern!r} cannot run on RE2, Toolport's regular-expression engine: {problem}")
        keyed = subschema.get("patternProperties")
        # Ajv compiles the keys when a member needs them, or an additionalProperties that is not
        # always valid tells the other properties apart with them.
        if isinstance(keyed, dict) and (any(_has_keywords(member) for member in keyed.values())
                                        or _has_keywords(subschema.get("additionalProperties"))):
            for key in keyed:
                problem = re2_problem(key)
                if problem is not None:
                    found.append(f"{path}.patternProperties key {key!r} cannot run on RE2, Toolport's "
                                 f"regular-expression engine: {problem}")
        if subschema.get("enum") == []:
            found.append(f"{path}.enum is empty (Toolport's validator needs at least one value)")
        ref = subschema.get("$ref")
        if resolvable and isinstance(ref, str) and not _resolves(schema, ref):
            found.append(f"{path}.$ref {ref!r} does not resolve (Toolport loads no other schema)")
    return found


_META_VALIDATORS: dict[type[Validator], Validator] = {}


def _meta_validator(cls: type[Validator]) -> Validator:
    """Checks a schema against its dialect's meta-schema as Toolport does (Ajv's copies of them,
    formats not asserted). Ajv's draft-07 meta-schema differs from the published one in one place,
    which decides: an ``enum`` must have at least one member and no duplicates."""
    validator = _META_VALIDATORS.get(cls)
    if validator is None:
        meta = cls.META_SCHEMA
        if cls is jsonschema.Draft7Validator:
            meta = copy.deepcopy(meta)
            meta["properties"]["enum"] = {**meta["properties"]["enum"], "minItems": 1, "uniqueItems": True}
        validator = _META_VALIDATORS[cls] = cls(meta, format_checker=None)
    return validator


def _dialect_name(cls: type[Validator]) -> str:
    return {jsonschema.Draft202012Validator: "2020-12", jsonschema.Draft201909Validator: "2019-09"}.get(cls, "draft-07")


def _has_id(schema: JsonSchema) -> bool:
    """True when an ``$id`` anywhere may change what a reference resolves against; references are
    then left to Toolport."""
    work: list[Any] = [schema]
    while work:
        item = work.pop()
        if isinstance(item, dict):
            if "$id" in item:
                return True
            work.extend(item.values())
        elif isinstance(item, list):
            work.extend(item)
    return False


def _has_keywords(schema: Any) -> bool:
    """True when Ajv surely compiles code for ``schema`` (``false``, or an object with a keyword
    it validates): not "always valid", in Ajv's words."""
    return schema is False or (isinstance(schema, dict) and any(key in _KEYWORDS for key in schema))


def _compiled(schema: JsonSchema, cls: type[Validator], *, follow_refs: bool) -> Iterator[tuple[dict[str, Any], str]]:
    """The subschemas (objects) Toolport's validator surely compiles, with their paths: the root,
    what its applicators compile of theirs (ajv/lib/vocabularies/applicator), and (``follow_refs``)
    what a local ``$ref`` names. ``$defs`` are compiled only through a ``$ref``; ``unevaluated*``
    are left out (whether Ajv compiles them depends on what the rest evaluates)."""
    draft2020 = cls is jsonschema.Draft202012Validator
    since2019 = draft2020 or cls is jsonschema.Draft201909Validator
    seen: set[int] = set()
    work: list[tuple[Any, str]] = [(schema, "parameters")]
    while work:
        item, path = work.pop()
        if not isinstance(item, dict) or id(item) in seen:
            continue
        seen.add(id(item))
        yield item, path
        for key in ("not", "propertyNames", "additionalProperties"):
            if _has_keywords(item.get(key)):
                work.append((item[key], f"{path}.{key}"))
        # `contains` is skipped with minContains 0 (and no maxContains) since 2019-09.
        if _has_keywords(item.get("contains")) and not (item.get("minContains") == 0 and "maxContains" not in item):
            work.append((item["contains"], f"{path}.contains"))
        # `if` is compiled only beside a `then` or `else` that is not always valid.
        if "if" in item and (_has_keywords(item.get("then")) or _has_keywords(item.get("else"))):
            for key in ("if", "then", "else"):
                if _has_keywords(item.get(key)):
                    work.append((item[key], f"{path}.{key}"))
        work.extend(_members(path, "allOf", item.get("allOf")))
        work.extend(_members(path, "oneOf", item.get("oneOf")))
        # `anyOf` with a member that is always valid is skipped whole, but for the dialects whose
        # validator tracks evaluated properties (2019-09, 2020-12: Ajv's `unevaluated` option).
        members = item.get("anyOf")
        if isinstance(members, list) and (since2019 or all(_has_keywords(member) for member in members)):
            work.extend(_members(path, "anyOf", members))
        work.extend(_members(path, "properties", item.get("properties")))
        work.extend(_members(path, "patternProperties", item.get("patternProperties")))
        dependencies = item.get("dependencies")
        if isinstance(dependencies, dict):  # a member is a subschema, or a list of names
            work.extend(_members(path, "dependencies", {k: v for k, v in dependencies.items() if not isinstance(v, list)}))
        if since2019:
            work.extend(_members(path, "dependentSchemas", item.get("dependentSchemas")))
        items = item.get("items")
        if draft2020:
            if _has_keywords(items):
                work.append((items, f"{path}.items"))
            work.extend(_members(path, "prefixItems", item.get("prefixItems")))
        elif isinstance(items, list):
            work.extend(_members(path, "items", items))
            # `additionalItems` is compiled only beside an array of `items`.
            if _has_keywords(item.get("additionalItems")):
                work.append((item["additionalItems"], f"{path}.additionalItems"))
        elif _has_keywords(items):
            work.append((items, f"{path}.items"))
        ref = item.get("$ref")
        if follow_refs and isinstance(ref, str) and ref.startswith("#/"):
            found, target = _pointer(schema, ref)
            if found:
                work.append((target, f"parameters{ref[1:].replace('/', '.')}"))


def _members(path: str, key: str, members: Any) -> list[tuple[Any, str]]:
    """The members of a map or list keyword that Ajv compiles (those not always valid)."""
    if isinstance(members, dict):
        return [(member, f"{path}.{key}.{name}") for name, member in members.items() if _has_keywords(member)]
    if isinstance(members, list):
        return [(member, f"{path}.{key}[{index}]") for index, member in enumerate(members) if _has_keywords(member)]
    return []


def _resolves(schema: JsonSchema, ref: str) -> bool:
    """False when ``ref`` surely resolves to nothing in ``schema`` (a document without ``$id``):
    a JSON pointer to no value, an anchor nobody declares, or another document. A reference to
    the whole schema (``#``, or ``""``: a recursive tree) resolves, in Toolport as here."""
    if ref in ("", "#"):
        return True
    if ref.startswith("#/"):
        return _pointer(schema, ref)[0]
    if ref.startswith("#"):
        name = ref[1:]
        work: list[Any] = [schema]
        while work:
            item = work.pop()
            if isinstance(item, dict):
                if item.get("$anchor") == name or item.get("$dynamicAnchor") == name:
                    return True
                work.extend(item.values())
            elif isinstance(item, list):
                work.extend(item)
        return False
    return False  # another document (a URL, a file name): Toolport has none to load


def _pointer(schema: JsonSchema, ref: str) -> tuple[bool, Any]:
    """The value the JSON pointer of ``ref`` (``#/a/b``, percent-encoded) names in ``schema``."""
    value: Any = schema
    for token in unquote(ref[2:]).split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict) and token in value:
            value = value[token]
        elif isinstance(value, list) and token.isdigit() and (token == "0" or not token.startswith("0")) and int(token) < len(value):
            value = value[int(token)]
        else:
            return False, None
    return True, value


# ---- RE2 ------------------------------------------------------------------------------------

# Escapes RE2 refuses (a letter or digit that is no escape of its syntax), checked against
# Toolport's own compile: \Z \G \e \h \R \X \N \k (named backreference), \8 \9.
_BAD_ESCAPES = frozenset("ZGehRXNk89")
# What may follow "(?" in RE2: flags (i m s U, "-" to clear), ":" or ")", or a named group.
_GROUP_FLAGS = re.compile(r"[imsU]*(?:-[imsU]*)?[:)]")
_REPEAT = re.compile(r"\{(\d+)(?:,(\d*))?\}")
_MAX_REPEAT = 1000


def re2_problem(pattern: str) -> str | None:
    """What makes RE2 (Toolport's engine for ``pattern``) surely refuse ``pattern``, or None when
    nothing sure does (RE2 may still refuse it, e.g. an unknown ``\\p{…}`` class: Toolport judges).
    """
    i, n = 0, len(pattern)
    depth = 0
    # What came last: "start" (nothing to repeat), "atom", "repeat" (a repetition operator) or
    # "lazy" (a repetition made lazy with "?"), so a doubled repetition is seen.
    last = "start"
    while i < n:
        c = pattern[i]
        if c == "\\":
            if i + 1 >= n:
                return "a trailing backslash"
            e = pattern[i + 1]
            if e == "Q":  # quoted text, to \E or the end
                end = pattern.find("\\E", i + 2)
                i = n if end < 0 else end + 2
                last = "atom"
                continue
            problem = _escape_problem(pattern, i, in_class=False)
            if problem is not None:
                return problem
            i = _escape_end(pattern, i)
            last = "atom"
        elif c == "[":
            end, problem = _class_end(pattern, i)
            if problem is not None:
                return problem
            i = end
            last = "atom"
        elif c == "(":
            if pattern.startswith("(?", i):
                rest = pattern[i + 2:]
                named = rest.startswith("P<") or (rest.startswith("<") and not rest.startswith(("<=", "<!")))
                if not named and _GROUP_FLAGS.match(rest) is None:
                    return f"the group {pattern[i:i + 4]!r}… is not RE2 syntax (no lookaround, atomic groups, conditionals, comments or backreferences)"
                i += 2
            else:
                i += 1
            depth += 1
            last = "start"
        elif c == ")":
            depth -= 1
            if depth < 0:
                return "an unmatched ')'"
            i += 1
            last = "atom"
        elif c == "|":
            i += 1
            last = "start"
        elif c in "*+?" or (c == "{" and _REPEAT.match(pattern, i)):
            repeat = _REPEAT.match(pattern, i) if c == "{" else None
            if repeat is not None:
                low, high = int(repeat.group(1)), repeat.group(2)
                if low > _MAX_REPEAT or (high not in (None, "") and (int(high) > _MAX_REPEAT or int(high) < low)):
                    return f"the repetition {repeat.group()} is outside RE2's 0-{_MAX_REPEAT}"
            token = repeat.group() if repeat is not None else c
            if last == "repeat" and c == "?":
                last = "lazy"
            elif last in ("repeat", "lazy"):
                return f"a repetition operator after another ({token!r}: RE2 has no possessive or doubled repetitions)"
            elif last == "start":
                return f"the repetition {token!r} has nothing to repeat"
            else:
                last = "repeat"
            i += len(token)
        else:
            i += 1
            last = "atom"
    if depth > 0:
        return "a '(' without its ')'"
    return None


def _escape_problem(pattern: str, i: int, *, in_class: bool) -> str | None:
    """Why RE2 refuses the escape at ``pattern[i]`` (a backslash), or None."""
    e = pattern[i + 1]
    if e in _BAD_ESCAPES:
        return f"the escape \\{e} is not RE2 syntax"
    if e in "1234567":
        following = pattern[i + 2:i + 3]
        if following == "" or following not in "01234567":  # \1-\7 alone: a backreference
            return f"the backreference \\{e} is not RE2 syntax"
    if in_class and e in "bQ":
        return f"the escape \\{e} has no meaning in a character class in RE2"
    return None


def _escape_end(pattern: str, i: int) -> int:
    """The index after the escape at ``pattern[i]``: ``\\p{…}``, ``\\x{…}`` and the like whole."""
    e = pattern[i + 1]
    if e in "pPx" and pattern.startswith("{", i + 2):
        end = pattern.find("}", i + 3)
        return len(pattern) if end < 0 else end + 1
    return i + 2


def _class_end(pattern: str, i: int) -> tuple[int, str | None]:
    """The index after the character class at ``pattern[i]`` (a ``[``), or why RE2 refuses it."""
    n = len(pattern)
    j = i + 1
    if pattern.startswith("^", j):
        j += 1
    if pattern.startswith("]", j):  # a "]" first is a member
        j += 1
    while j < n:
        c = pattern[j]
        if c == "]":
            return j + 1, None
        if c == "\\":
            if j + 1 >= n:
                return n, "a trailing backslash"
            problem = _escape_problem(pattern, j, in_class=True)
            if problem is not None:
                return n, problem
            j = _escape_end(pattern, j)
        elif pattern.startswith("[:", j):  # a POSIX class, [:alpha:]
            end = pattern.find(":]", j + 2)
            j = j + 1 if end < 0 else end + 2
        else:
            j += 1
    return n, "a '[' without its ']'"
