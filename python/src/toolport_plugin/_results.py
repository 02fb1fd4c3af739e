"""What a handler returns or raises, and the callback reply it becomes (docs/protocol.md R10, R11).

- a value → ``{"output": value, "is_error": false}``
- ``ToolOutput(value, images=[...])``, an ``Image`` or a list of ``Image`` → the same, plus
  ``"images": [{"data_b64", "mime", "vision_prompt"}]``
- ``raise ToolError(message, output=...)`` → ``{"error": message, "output": ..., "is_error": true}``
- any other exception → ``{"error": "<Type>: <message>", "is_error": true}`` (never a stack trace)
"""
from __future__ import annotations

import base64
import mimetypes
import os
from collections.abc import Iterable
from typing import Any

from ._json import encode
from ._schema import to_json_value


class ToolError(Exception):
    """Raise it in a handler to answer the model with a tool error.

    ``message`` is what the model reads as ``error`` (a short code such as ``"NO_DATA"`` or a
    sentence); ``output`` (any JSON value) travels beside it, and the model reads both:
    ``{"error": "NO_DATA", "output": {"reason": "no such city"}}``.

    Example::

        raise ToolError("NO_DATA", output={"reason": "no such city"})
    """

    def __init__(self, message: str, *, output: Any = None) -> None:
        super().__init__(message)
        self.message = str(message)
        self.output = output


class Image:
    """An image for a vision-capable model, sent in the reply's ``images`` channel.

    Example::

        return ToolOutput({"width": 640}, images=[Image.from_bytes(png, mime="image/png")])
    """

    __slots__ = ("data", "mime", "vision_prompt")

    def __init__(self, data: bytes, mime: str, vision_prompt: str | None = None) -> None:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError("Image data must be bytes")
        if not isinstance(mime, str) or not mime.startswith("image/"):
            raise ValueError(f"Image mime must be an image/* type (got {mime!r})")
        self.data = bytes(data)
        self.mime = mime
        self.vision_prompt = vision_prompt

    @classmethod
    def from_bytes(cls, data: bytes, mime: str = "image/png", vision_prompt: str | None = None) -> Image:
        """An image from its encoded bytes (PNG or JPEG are what Toolport passes on)."""
        return cls(data, mime, vision_prompt)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], mime: str | None = None, vision_prompt: str | None = None) -> Image:
        """An image read from a file; the type is guessed from the file name unless given."""
        guessed = mime or mimetypes.guess_type(os.fspath(path))[0]
        if guessed is None:
            raise ValueError(f"cannot tell the image type of {os.fspath(path)!r}; pass mime=")
        with open(path, "rb") as f:
            return cls(f.read(), guessed, vision_prompt)

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"data_b64": base64.b64encode(self.data).decode("ascii"), "mime": self.mime}
        if self.vision_prompt is not None:
            wire["vision_prompt"] = self.vision_prompt
        return wire

    def __repr__(self) -> str:
        return f"Image({len(self.data)} bytes, {self.mime!r})"


class ToolOutput:
    """A tool's output together with images.

    Example::

        return ToolOutput({"city": "Oslo"}, images=[Image.from_file("radar.png")])
    """

    __slots__ = ("value", "images")

    def __init__(self, value: Any = None, *, images: Iterable[Image] = ()) -> None:
        self.value = value
        self.images = list(images)
        for image in self.images:
            if not isinstance(image, Image):
                raise TypeError(f"images must be Image objects (got {type(image).__name__})")


def error_reply(message: str, output: Any = None) -> bytes:
    reply: dict[str, Any] = {"error": message, "is_error": True}
    if output is not None:
        try:
            reply["output"] = to_json_value(output)
            return encode(reply)
        except (TypeError, ValueError, RecursionError) as err:
            reply = {"error": f"{message} (its output could not be encoded as JSON: {err})", "is_error": True}
    return encode(reply)


def output_reply(result: Any) -> bytes:
    """A handler's return value → the reply body; an output that is not JSON becomes a tool error."""
    images: list[Image] = []
    if isinstance(result, ToolOutput):
        images, result = result.images, result.value
    elif isinstance(result, Image):
        images, result = [result], None
    elif isinstance(result, (list, tuple)) and result and all(isinstance(x, Image) for x in result):
        images, result = list(result), None
    reply: dict[str, Any] = {"output": result, "is_error": False}
    if not images:
        # Plain JSON data (the common case) is encoded as it is, without a converted copy first;
        # anything else (a dataclass, a model, a set, an Enum) makes json.dumps raise, and is
        # converted below.
        try:
            return encode(reply)
        except TypeError:
            pass
        except (ValueError, RecursionError) as err:
            return error_reply(f"the tool's output could not be encoded as JSON: {err}")
    try:
        reply["output"] = to_json_value(result)
        if images:
            reply["images"] = [image.to_wire() for image in images]
        return encode(reply)
    except (TypeError, ValueError, RecursionError) as err:  # RecursionError: a model's own dump
        return error_reply(f"the tool's output could not be encoded as JSON: {err}")


def exception_reply(err: BaseException) -> bytes:
    if isinstance(err, ToolError):
        return error_reply(err.message, err.output)
    try:
        text = str(err)
    except Exception:  # an exception whose __str__ fails is still a tool error, never an HTTP 500
        text = ""
    return error_reply(f"{type(err).__name__}: {text}" if text else type(err).__name__)
