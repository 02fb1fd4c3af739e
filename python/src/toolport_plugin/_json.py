"""JSON text to and from Toolport: compact, strict, any depth, and any Python string.

``encode`` writes plain JSON data (dicts with string keys, lists and tuples, strings, ints, finite
floats, booleans, None) as UTF-8 JSON, as ``JSON.stringify`` would for the same value (the
TypeScript SDK's encoder; docs/protocol.md R10):

- NaN and ±Infinity are refused (``ValueError``): JSON has no such numbers, and Toolport would
  refuse the whole body;
- a lone surrogate (``"\\udfff"``, e.g. from an argument Toolport delivered as the JSON escape
  ``\\udfff``) is written as its ``\\u`` escape, as ``JSON.stringify`` writes it: UTF-8 has no
  encoding for it, and the rest of the text keeps its UTF-8;
- nesting is not limited by Python's recursion limit: Toolport carries replies of any depth (its
  reply scan keeps its own stack, src/shared/json-scan.ts), so past the depth ``json.dumps`` can
  recurse to, the same text is written without recursion.

``decode`` reads a call's body or its ``raw_arguments`` as ``json.loads`` does, at any depth too:
Toolport checks the arguments' schema, not their depth (a model's ``raw_arguments`` is a string
inside the call), and passes on whatever it accepted.
"""
from __future__ import annotations

import json
import re
from json.decoder import scanstring  # type: ignore[attr-defined]
from json.encoder import encode_basestring
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")
# Work items of the iterative encoder: a value to write, a finished piece of text, or the end of
# a container (it leaves the path the cycle check looks at).
_VALUE, _TEXT, _LEAVE = 0, 1, 2
_SPACE = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_CONSTANTS: dict[str, Any] = {"true": True, "false": False, "null": None}


def encode(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON. Raises ``ValueError`` for NaN, ±Infinity or a cycle and
    ``TypeError`` for anything that is not JSON data."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except RecursionError:
        text = _dumps_deep(value)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # Only strings can hold a surrogate (all else json.dumps writes is ASCII): its JSON escape
        # is the same string. Two surrogates that form a pair are read back as their one character.
        return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text).encode("utf-8")


def _dumps_deep(value: Any) -> str:
    """``json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))`` with a
    stack of its own instead of recursion."""
    parts: list[str] = []
    on_path: set[int] = set()
    work: list[tuple[int, Any]] = [(_VALUE, value)]
    while work:
        kind, item = work.pop()
        if kind == _TEXT:
            parts.append(item)
        elif kind == _LEAVE:
            on_path.discard(item)
        elif isinstance(item, str):
            parts.append(encode_basestring(item))
        elif item is None or item is True or item is False:
            parts.append("null" if item is None else "true" if item else "false")
        elif isinstance(item, int):
            parts.append(int.__repr__(item))
        elif isinstance(item, float):
            parts.append(_float(item))
        elif isinstance(item, (list, tuple, dict)):
            if id(item) in on_path:
                raise ValueError("Circular reference detected")
            on_path.add(id(item))
            work.append((_LEAVE, id(item)))
            if isinstance(item, dict):
                parts.append("{")
                work.append((_TEXT, "}"))
                entries = list(item.items())
                for index in range(len(entries) - 1, -1, -1):
                    key, member = entries[index]
                    work.append((_VALUE, member))
                    work.append((_TEXT, ("," if index else "") + encode_basestring(_key(key)) + ":"))
            else:
                parts.append("[")
                work.append((_TEXT, "]"))
                for index in range(len(item) - 1, -1, -1):
                    work.append((_VALUE, item[index]))
                    if index:
                        work.append((_TEXT, ","))
        else:
            raise TypeError(f"Object of type {type(item).__name__} is not JSON serializable")
    return "".join(parts)


def _float(number: float) -> str:
    if number != number or number in (float("inf"), float("-inf")):
        raise ValueError(f"Out of range float values are not JSON compliant: {number!r}")
    return float.__repr__(number)


def _key(key: Any) -> str:
    """A dict key as ``json.dumps`` writes it."""
    if isinstance(key, str):
        return key
    if key is None or key is True or key is False:
        return "null" if key is None else "true" if key else "false"
    if isinstance(key, int):
        return int.__repr__(key)
    if isinstance(key, float):
        return _float(key)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode(data: bytes | str) -> Any:
    """``json.loads(data)``, at any depth. Raises ``ValueError`` for text that is not JSON, the
    tokens ``NaN`` and ``±Infinity`` included (Python's parser takes them; JSON has no such numbers,
    and Toolport never sends them). Bytes are strict UTF-8 (``UnicodeDecodeError``, a
    ``ValueError``, otherwise), as the TypeScript SDK reads a body: ``json.loads`` would also take a
    byte order mark, UTF-16 or UTF-32, which no call is (a BOM in the text is refused as not JSON)."""
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        return _loads_deep(text)


def _loads_deep(text: str) -> Any:
    """``decode(text)`` with a stack of its own instead of recursion: what it accepts, and what it
    makes of it (the last of duplicate keys wins)."""
    # Each open container: [list, None] or [dict, the key whose value comes next].
    open_: list[list[Any]] = []
    i = _SPACE.match(text, 0).end()  # type: ignore[union-attr]
    while True:
        c = text[i:i + 1]
        if c in ("{", "["):
            i = _SPACE.match(text, i + 1).end()  # type: ignore[union-attr]
            if text.startswith("}" if c == "{" else "]", i):
                value: Any = {} if c == "{" else []
                i += 1
            elif c == "{":
                key, i = _member_key(text, i)
                open_.append([{}, key])
                continue
            else:
                open_.append([[], None])
                continue
        elif c == '"':
            value, i = scanstring(text, i + 1, True)
        else:
            number = _NUMBER.match(text, i)
            constant = next((k for k in _CONSTANTS if text.startswith(k, i)), None)
            if number is not None:
                literal = number.group()
                value = float(literal) if number.group(1) or number.group(2) else int(literal)
                i = number.end()
            elif constant is not None:
                value, i = _CONSTANTS[constant], i + len(constant)
            else:
                raise ValueError(f"Expecting value: char {i}")
        # A value is complete: it goes into its container, which may be complete in turn.
        while True:
            i = _SPACE.match(text, i).end()  # type: ignore[union-attr]
            if not open_:
                if i != len(text):
                    raise ValueError(f"Extra data: char {i}")
                return value
            top = open_[-1]
            container = top[0]
            if isinstance(container, dict):
                container[top[1]] = value
                if text.startswith(",", i):
                    top[1], i = _member_key(text, _SPACE.match(text, i + 1).end())  # type: ignore[union-attr]
                    break
                closer = "}"
            else:
                container.append(value)
                if text.startswith(",", i):
                    i = _SPACE.match(text, i + 1).end()  # type: ignore[union-attr]
                    break
                closer = "]"
            if not text.startswith(closer, i):
                raise ValueError(f"Expecting ',' delimiter or {closer!r}: char {i}")
            i += 1
            value = open_.pop()[0]


def _member_key(text: str, i: int) -> tuple[str, int]:
    """An object member's key at ``text[i]`` and the index of its value (after the ``:``)."""
    if not text.startswith('"', i):
        raise ValueError(f"Expecting property name enclosed in double quotes: char {i}")
    key, i = scanstring(text, i + 1, True)
    i = _SPACE.match(text, i).end()  # type: ignore[union-attr]
    if not text.startswith(":", i):
        raise ValueError(f"Expecting ':' delimiter: char {i}")
    return key, _SPACE.match(text, i + 1).end()  # type: ignore[union-attr]
