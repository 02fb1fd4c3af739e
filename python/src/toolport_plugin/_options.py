"""The options of ``Plugin``, checked once, up front: every problem is named at construction
instead of the first one surfacing at ``start()`` (Toolport would answer them with a 422)."""
from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

from . import errors
from ._loopback import is_loopback_hostname, loopback_ip
from .errors import PluginError

DEFAULT_TOOLPORT_URL = "http://127.0.0.1:3917"
_MAX_SOURCE_CHARS = 256


def check_options(
    id: Any,  # noqa: A002
    *,
    toolport_url: str | None,
    role: Any,
    token: Any,
    token_file: str | None,
    host: Any,
    port: Any,
    seconds: dict[str, Any],
    start_timeout: Any,
    max_body_bytes: Any,
) -> tuple[str, str, str | None, str]:
    """Returns (source, Toolport URL, token, callback host), or raises TP_ERR_PLUGIN_OPTIONS naming
    each problem."""
    problems: list[dict[str, str]] = []

    def bad(path: str, message: str) -> None:
        problems.append({"path": path, "message": message})

    source = id if isinstance(id, str) and id.startswith("plugin:") else f"plugin:{id}"
    if not isinstance(id, str) or source == "plugin:":
        bad("id", "must be a non-empty string (the source becomes plugin:<id>)")
    elif len(source) > _MAX_SOURCE_CHARS:
        bad("id", f"plugin:<id> must be at most {_MAX_SOURCE_CHARS} characters")
    url = toolport_url or os.environ.get("TOOLPORT_URL") or DEFAULT_TOOLPORT_URL
    try:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or not is_loopback_hostname(parts.hostname):
            bad("toolport_url", f"must be an http(s) URL on a loopback address (got {url!r})")
        elif parts.username or parts.password:
            bad("toolport_url", "must not carry credentials; use token=")
        _ = parts.port  # raises for a bad port
    except ValueError as err:
        bad("toolport_url", f"is not a URL: {err}")
    if role is not None and (not isinstance(role, str) or role == ""):
        bad("role", "must be a role name, or None for every role")
    bind_host = _bind_host(host)
    if bind_host is None:
        bad("host", "must be a loopback IP address such as 127.0.0.1 or ::1")
    if not isinstance(port, int) or not 0 <= port <= 65535:
        bad("port", "must be 0 (any free port) to 65535")
    for name, value in seconds.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            bad(name, "must be a positive number of seconds")
    if not isinstance(start_timeout, (int, float)) or start_timeout < 0:
        bad("start_timeout", "must be 0 or more seconds")
    if not isinstance(max_body_bytes, int) or max_body_bytes < 1024:
        bad("max_body_bytes", "must be at least 1024")
    token_file = token_file or (os.environ.get("TOOLPORT_TOKEN_FILE") if token is None else None)
    if token is None and token_file:
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as err:
            bad("token_file", f"cannot be read: {err.strerror}")
    if token is not None and (not isinstance(token, str) or token == "" or any(c in token for c in "\r\n")):
        bad("token", "must be a non-empty single-line string")
    if problems:
        raise PluginError(errors.OPTIONS, "invalid plugin options: " + "; ".join(f"{p['path']} {p['message']}" for p in problems),
                          details=problems)
    return source, url, token, bind_host or ""


def _bind_host(host: Any) -> str | None:
    """The callback server's address in the canonical form Toolport stores callback URLs in (the
    WHATWG URL serialisation: ``0:0:0:0:0:0:0:1`` is ``::1``), or None when ``host`` is not a
    loopback IP. An IPv4-mapped ``::ffff:127.x.y.z`` is its IPv4 address: asyncio's IPv6 sockets
    (IPV6_V6ONLY) cannot bind it, and a connection to it reaches the IPv4 address anyway."""
    if not isinstance(host, str) or "%" in host:  # a zone id (::1%lo) has no place in a URL
        return None
    address = loopback_ip(host)  # None for a name (localhost…), brackets, or no address at all
    return None if address is None else str(address)
