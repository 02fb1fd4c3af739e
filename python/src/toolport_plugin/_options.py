"""The options of ``Plugin``, checked once, up front: every problem is named at construction
instead of the first one surfacing at ``start()`` (Toolport would answer them with a 422)."""
from __future__ import annotations

import math
import os
import re
from typing import Any

from . import errors
from ._loopback import loopback_api_url, loopback_ip
from .errors import PluginError

DEFAULT_TOOLPORT_URL = "http://127.0.0.1:3917"
_MAX_SOURCE_CHARS = 256
# A token, as Toolport's `security.token` must be (README "Configuration"): visible ASCII only. An
# HTTP header cannot carry a line break, Toolport reads header bytes as Latin-1 and trims their
# ends: visible ASCII is what every client sends, and Toolport reads, unchanged.
_VISIBLE_ASCII = re.compile(r"[\x21-\x7e]+")
# Toolport's shortest `security.token` (32 bytes; visible ASCII is one byte a character).
_MIN_TOKEN_CHARS = 32


def check_options(
    id: Any,  # noqa: A002
    *,
    toolport_url: Any,
    role: Any,
    token: Any,
    token_file: Any,
    plugin_key: Any,
    host: Any,
    port: Any,
    seconds: dict[str, Any],
    start_timeout: Any,
    use_events: Any,
    max_body_bytes: Any,
) -> tuple[str, str, str | None, str]:
    """Returns (source, Toolport URL, token, callback host), or raises TP_ERR_PLUGIN_OPTIONS naming
    each problem. The URL is the API's base as the TypeScript SDK keeps it: read as the WHATWG
    parser reads it (src/shared/loopback.ts, checkCallbackUrl), with its path prefix and without a
    query or fragment (an API path is joined to it)."""
    problems: list[dict[str, str]] = []

    def bad(path: str, message: str) -> None:
        problems.append({"path": path, "message": message})

    source = id if isinstance(id, str) and id.startswith("plugin:") else f"plugin:{id}"
    if not isinstance(id, str) or source == "plugin:":
        bad("id", "must be a non-empty string (the source becomes plugin:<id>)")
    elif _utf16_length(source) > _MAX_SOURCE_CHARS:
        # Toolport counts a string's UTF-16 code units: an astral character (😀) is two.
        bad("id", f"plugin:<id> must be at most {_MAX_SOURCE_CHARS} characters (UTF-16 code units, as Toolport counts)")
    url = toolport_url or os.environ.get("TOOLPORT_URL") or DEFAULT_TOOLPORT_URL
    if not isinstance(url, str):
        bad("toolport_url", f"must be a URL string (got {type(url).__name__})")
    else:
        try:
            url = loopback_api_url(url)
        except ValueError as err:
            bad("toolport_url", f"{err} (got {url!r})")
    if role is not None and (not isinstance(role, str) or role == ""):
        bad("role", "must be a role name, or None for every role")
    bind_host = _bind_host(host)
    if bind_host is None:
        bad("host", "must be a loopback IP address such as 127.0.0.1 or ::1")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        bad("port", "must be an integer from 0 (any free port) to 65535")
    for name, value in seconds.items():
        if not _is_finite(value) or not value > 0:
            bad(name, "must be a positive, finite number of seconds")
    if not _is_finite(start_timeout) or not start_timeout >= 0:
        bad("start_timeout", "must be 0 or a positive, finite number of seconds")
    if not isinstance(use_events, bool):
        bad("use_events", "must be True or False")
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 1:
        bad("max_body_bytes", "must be a positive integer")
    from_env = not token_file and token is None and bool(os.environ.get("TOOLPORT_TOKEN_FILE"))
    token_file = token_file or (os.environ.get("TOOLPORT_TOKEN_FILE") if token is None else None)
    # A token read from a file is judged as that file's content, naming the file (and where its
    # name came from), not as a `token` the program never passed.
    token_path = "token"
    what = "must be"
    if token is None and token_file:
        where = f"{str(token_file)!r}{' (from TOOLPORT_TOKEN_FILE)' if from_env else ''}"
        token_path = "token_file"
        what = f"{where} must hold a token of"
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except (OSError, UnicodeDecodeError) as err:
            bad("token_file", f"{where} cannot be read: {getattr(err, 'strerror', None) or err}")
        else:
            if token == "":
                bad("token_file", f"{where} is empty: it must hold the token")
                token = None
    if token is not None and (not isinstance(token, str) or _VISIBLE_ASCII.fullmatch(token) is None):
        bad(token_path, f"{what} visible ASCII characters only (0x21-0x7E), as Toolport's security.token is: "
                        "no space, line break or other character")
    elif token is not None and len(token) < _MIN_TOKEN_CHARS:
        # Toolport refuses a shorter security.token: this one could never be accepted.
        bad(token_path, f"{what} at least {_MIN_TOKEN_CHARS} characters, as Toolport's security.token is")
    if plugin_key is not None and (not isinstance(plugin_key, str) or not 32 <= len(plugin_key) <= 512
                                   or _VISIBLE_ASCII.fullmatch(plugin_key) is None):
        bad("plugin_key", "must be 32-512 visible ASCII characters (e.g. secrets.token_urlsafe(32))")
    if problems:
        raise PluginError(errors.OPTIONS, "invalid plugin options: " + "; ".join(f"{p['path']} {p['message']}" for p in problems),
                          details=problems)
    return source, url, token, bind_host or ""


def _is_finite(value: Any) -> bool:
    """A number of seconds the SDK can wait: an int or float (not a bool), neither NaN nor
    ±Infinity, and within a float's range (an int is turned into one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def _utf16_length(text: str) -> int:
    """The length of ``text`` in UTF-16 code units, as JavaScript (and Toolport) count it."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _bind_host(host: Any) -> str | None:
    """The callback server's address in the canonical form Toolport stores callback URLs in (the
    WHATWG URL serialisation: ``0:0:0:0:0:0:0:1`` is ``::1``), or None when ``host`` is not a
    loopback IP. An IPv4-mapped ``::ffff:127.x.y.z`` is its IPv4 address: asyncio's IPv6 sockets
    (IPV6_V6ONLY) cannot bind it, and a connection to it reaches the IPv4 address anyway."""
    if not isinstance(host, str) or "%" in host:  # a zone id (::1%lo) has no place in a URL
        return None
    address = loopback_ip(host)  # None for a name (localhost…), brackets, or no address at all
    return None if address is None else str(address)
