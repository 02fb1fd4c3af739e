"""The SDK's client of Toolport's HTTP API: register, clear, list, health, and the event stream.

Every request to Toolport goes through ``_request`` (and the stream through ``events``), which add
the headers in one place (``_headers``), so a credential scheme beyond the bearer token is one
change here. The client has its own aiohttp session with ``trust_env=False``: a proxy configured in
the environment must never see this loopback traffic or its token.
"""
from __future__ import annotations

import asyncio
import builtins
import json
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import quote

import aiohttp

from ._json import encode
from .errors import OPTIONS, REFUSED, UNREACHABLE, PluginError

# An answer can be large (a list holds our tools' rows in every role), but not this large; past it
# the answer is refused.
_MAX_ANSWER_BYTES = 64 * 1024 * 1024
# The ``name=…`` query of one list request stays under this many characters: far below Toolport's
# (Node's) 16 KiB limit on a request's headers, the request line included.
_MAX_LIST_QUERY_CHARS = 4096
# One SSE line longer than this is not a Toolport event.
_MAX_EVENT_LINE_BYTES = 1024 * 1024
# Nor is one event whose data lines add up to more: Toolport drops a subscriber that leaves more
# than 1 MiB unread (README "Events (SSE)": events.maxSubscriberBufferBytes), so it never sends one.
_MAX_EVENT_BYTES = 1024 * 1024
# No byte on the event stream for this long (Toolport sends a heartbeat comment every 15 s by
# default, README events.heartbeatMs) means the connection is dead without having said so: the
# follower reconnects, as the TypeScript SDK does.
_EVENT_SILENCE_SECONDS = 45.0


class NoEventStream(Exception):
    """This Toolport does not serve ``GET /api/events``; the caller falls back to polling."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class ToolportClient:
    def __init__(self, base_url: str, token: str | None, request_timeout: float, plugin_key: str | None = None) -> None:
        self.base_url = base_url if base_url.endswith("/") else base_url + "/"
        self._token = token
        self._plugin_key = plugin_key
        self._timeout = request_timeout
        self._session: aiohttp.ClientSession | None = None

    def fresh(self) -> ToolportClient:
        """A client of the same Toolport, with sessions of its own (for another event loop)."""
        return ToolportClient(self.base_url, self._token, self._timeout, self._plugin_key)

    def _headers(self, *, json_body: bool = False) -> dict[str, str]:
        headers = {"accept": "application/json", "user-agent": "toolport-plugin-python"}
        if self._token is not None:
            headers["authorization"] = f"Bearer {self._token}"
        if self._plugin_key is not None:
            # Ownership mode binds our source to this key; Toolport ignores it otherwise.
            headers["x-toolport-plugin-key"] = self._plugin_key
        if json_body:
            headers["content-type"] = "application/json"
        return headers

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            # Idle sockets close after 4 s, before Toolport's side does, so a poll never writes
            # into a socket the server is closing.
            connector = aiohttp.TCPConnector(limit=4, keepalive_timeout=4.0)
            self._session = aiohttp.ClientSession(connector=connector, trust_env=False)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def register(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /api/tools/register``; an ``ok: false`` answer (no role took it) is an error."""
        answer = await self._request("POST", "api/tools/register", body)
        failed = answer.get("failed_roles")
        failed = failed if isinstance(failed, list) else []
        if answer.get("ok") is not True:
            reason = answer.get("error") if isinstance(answer.get("error"), str) else "no role accepted it"
            details = role_problems(failed)
            err = PluginError(
                REFUSED, f"Toolport did not register {body.get('name')!r}: {reason}{problems_text(details)}",
                details=details,
            )
            # Every role refused it (another source or a local tool owns the name), or there was
            # no role: the registry does not hold it. Otherwise some role took it and its sync failed.
            err._nothing_registered = all(_is_owner_refusal(f) for f in failed)
            # A name that is taken stays taken: retrying would only wait out start_timeout.
            err._name_taken = err._nothing_registered and len(failed) > 0
            raise err
        answer["refused"] = role_problems([f for f in failed if _is_owner_refusal(f)])
        answer["unsynced"] = role_problems([f for f in failed if not _is_owner_refusal(f)])
        return answer

    async def clear(self, source: str, role: str | None) -> int:
        """``POST /api/tools/clear``; returns how many registrations it removed."""
        answer = await self._request("POST", "api/tools/clear", {"source": source, "role": role})
        removed = answer.get("removed")
        return removed if isinstance(removed, int) and not isinstance(removed, bool) else 0

    async def list(self, role: str | None, names: Iterable[str]) -> dict[str, builtins.list[dict[str, Any]]]:
        """``GET /api/tools?name=…``: the rows of ``names`` in every current role (or in one), by
        role, whatever their source (a name another source took over must be seen as taken, not as
        missing). Only those names are asked for, so the answer does not grow with other plugins'
        registrations. Names too many for one query are asked for in several requests; a role is
        kept only when every answer lists it (one added or removed meanwhile is left to the next
        check)."""
        role_query = "" if role is None else f"role={quote(role, safe='')}&"
        by_role: dict[str, builtins.list[dict[str, Any]]] | None = None
        for name_query in name_queries(names):
            answer = await self._list_once(role_query + name_query)
            if by_role is None:
                by_role = answer
                continue
            for role_name in builtins.list(by_role):
                more = answer.get(role_name)
                if more is None:
                    del by_role[role_name]
                else:
                    by_role[role_name].extend(more)
        return by_role or {}

    async def _list_once(self, query: str) -> dict[str, builtins.list[dict[str, Any]]]:
        answer = await self._request("GET", "api/tools", query=query)
        by_role = answer.get("tools_by_role")
        if not isinstance(by_role, dict):
            raise PluginError(REFUSED, "Toolport listed no tools_by_role: is this a Toolport API?")
        return {name: [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []
                for name, rows in by_role.items()}

    async def health(self) -> dict[str, Any]:
        """``GET /api/health``; a 503 (not ready) is an error like any other 5xx."""
        return await self._request("GET", "api/health")

    async def _request(self, method: str, path: str, body: Any = None, *, query: str = "") -> dict[str, Any]:
        """``query`` goes into the URL only: messages name the route, not a list of tool names."""
        session = self._open()
        url = self.base_url + path + (f"?{query}" if query else "")
        timeout = aiohttp.ClientTimeout(total=self._timeout)
        try:
            # Strict JSON (no NaN, which Toolport would refuse as a body that is not JSON), of any
            # depth; a schema changed after it was declared may no longer be JSON.
            data = None if body is None else encode(body)
        except (TypeError, ValueError) as err:
            raise PluginError(OPTIONS, f"the request body of {method} /{path} is not JSON: {err}") from err
        try:
            async with session.request(
                method, url, headers=self._headers(json_body=body is not None),
                data=data, timeout=timeout, allow_redirects=False,
            ) as res:
                status = res.status
                raw = await _read_body(res, f"{method} /{path}")
        except PluginError:
            raise
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
            what = f"no answer within {self._timeout} s" if isinstance(err, asyncio.TimeoutError) else _describe(err)
            unreachable = PluginError(UNREACHABLE, f"cannot reach Toolport at {self.base_url} ({method} /{path}): {what}")
            # No connection, so no request: a registration that was never sent registered nothing.
            unreachable._nothing_registered = isinstance(err, aiohttp.ClientConnectorError)
            raise unreachable from err
        try:
            parsed = json.loads(raw) if raw else {}
        except ValueError:
            parsed = None
        answer = parsed if isinstance(parsed, dict) else None
        if status >= 300 or answer is None:
            # Toolport's error body: {ok: false, statusCode, code, error, message, details?}.
            code = answer.get("code") if answer and isinstance(answer.get("code"), str) else None
            message = answer.get("message") if answer and isinstance(answer.get("message"), str) else f"HTTP {status}"
            details = [d for d in answer.get("details", []) if isinstance(d, dict)] if answer and isinstance(answer.get("details"), list) else []
            detail_text = "; ".join(f"{d.get('path', '')}: {d.get('message', '')}" for d in details)
            raise PluginError(
                REFUSED,
                f"Toolport refused {method} /{path}: {message}" + (f" [{code}]" if code else "") + (f" ({detail_text})" if detail_text else ""),
                status=status, toolport_code=code, details=details,
            )
        return answer

    @asynccontextmanager
    async def events(self, types: builtins.list[str] | None) -> AsyncIterator[AsyncIterator[tuple[str, dict[str, Any]]]]:
        """Opens ``GET /api/events`` (Server-Sent Events) and yields an iterator of (event, data).

        Raises ``NoEventStream`` when this Toolport has no usable stream (404, a 200 that is not an
        event stream) or refuses the ``types`` filter (400, 422); any other answer that is not 2xx
        (401, 403, 429, 5xx…) is a ``PluginError`` the follower retries with backoff, as the
        TypeScript SDK does. The iterator ends when the stream does (Toolport closed or went away).
        """
        session = self._open()
        url = f"{self.base_url}api/events" + ("" if types is None else f"?types={quote(','.join(types), safe=',')}")
        headers = {**self._headers(), "accept": "text/event-stream"}
        # No overall limit: the stream is open for as long as Toolport runs. Connecting has the usual
        # budget; a read waits at most _EVENT_SILENCE_SECONDS (heartbeats keep a live stream busy).
        timeout = aiohttp.ClientTimeout(total=None, connect=self._timeout, sock_connect=self._timeout,
                                        sock_read=_EVENT_SILENCE_SECONDS)
        try:
            res = await session.get(url, headers=headers, timeout=timeout, allow_redirects=False)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
            raise PluginError(UNREACHABLE, f"cannot reach Toolport at {self.base_url} (GET /api/events): {_describe(err)}") from err
        try:
            content_type = res.headers.get("content-type", "")
            # 404: a Toolport without the stream; 400/422: a filter it does not know; a body that is
            # not an event stream: not usable either. Polling still works. Other refusals (a token
            # not accepted yet, a rate limit, a Toolport closing) may pass: retried with backoff.
            if res.status in (400, 404, 422) or (res.status < 300 and not content_type.startswith("text/event-stream")):
                raise NoEventStream(f"HTTP {res.status} ({content_type or 'no content type'})", res.status)
            if res.status >= 300:
                raise PluginError(REFUSED, f"Toolport refused GET /api/events: HTTP {res.status}", status=res.status)
            yield _read_events(res)
        finally:
            res.close()


def name_queries(names: Iterable[str]) -> builtins.list[str]:
    """``names`` as ``name=…&name=…`` queries of at most ``_MAX_LIST_QUERY_CHARS`` characters each
    (one name at least)."""
    queries: builtins.list[str] = []
    query = ""
    for name in names:
        param = "name=" + quote(name, safe="")
        if query and len(query) + 1 + len(param) > _MAX_LIST_QUERY_CHARS:
            queries.append(query)
            query = ""
        query = f"{query}&{param}" if query else param
    if query:
        queries.append(query)
    return queries


async def _read_body(res: aiohttp.ClientResponse, what: str) -> bytes:
    """The whole body, however many pieces it arrives in; past ``_MAX_ANSWER_BYTES`` it is refused
    without reading on. A connection cut mid-body raises ``aiohttp.ClientPayloadError``."""
    # With its status: an answer this large is no passing failure, and start() does not retry it.
    too_large = PluginError(REFUSED, f"Toolport's answer to {what} is larger than {_MAX_ANSWER_BYTES} bytes",
                            status=res.status)
    if res.content_length is not None and res.content_length > _MAX_ANSWER_BYTES:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in res.content.iter_any():
        size += len(chunk)
        if size > _MAX_ANSWER_BYTES:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


async def _read_lines(res: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The stream's lines (without their end), each at most ``_MAX_EVENT_LINE_BYTES``: a longer one
    is refused before it is buffered whole."""
    pending = b""
    async for chunk in res.content.iter_any():
        pending += chunk
        start = 0
        while True:
            end = pending.find(b"\n", start)
            if end < 0:
                break
            if end - start > _MAX_EVENT_LINE_BYTES:
                break
            yield pending[start:end]
            start = end + 1
        pending = pending[start:]
        if len(pending) > _MAX_EVENT_LINE_BYTES and pending.find(b"\n", 0, _MAX_EVENT_LINE_BYTES + 1) < 0:
            raise PluginError(REFUSED, f"Toolport sent an event line larger than {_MAX_EVENT_LINE_BYTES} bytes")
    if pending:
        yield pending  # the stream ended mid-line: the spec drops an unfinished event anyway


async def _read_events(res: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """Parses an SSE stream (https://html.spec.whatwg.org/multipage/server-sent-events.html)."""
    event, size = "message", 0
    data: list[str] = []
    try:
        async for line_bytes in _read_lines(res):
            line = line_bytes.decode("utf-8", "replace").rstrip("\r")
            if line == "":
                if data:
                    try:
                        payload = json.loads("\n".join(data))
                    except ValueError:
                        payload = None
                    yield event, payload if isinstance(payload, dict) else {}
                event, data, size = "message", [], 0
            elif line.startswith(":"):
                continue
            else:
                field, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if field == "event":
                    event = value
                elif field == "data":
                    size += len(line_bytes) + 1
                    if size > _MAX_EVENT_BYTES:
                        raise PluginError(REFUSED, f"Toolport sent an event larger than {_MAX_EVENT_BYTES} bytes")
                    data.append(value)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
        what = f"no byte for {_EVENT_SILENCE_SECONDS:g} s" if isinstance(err, asyncio.TimeoutError) else _describe(err)
        raise PluginError(UNREACHABLE, f"the event stream broke: {what}") from err


def _describe(err: BaseException) -> str:
    text = str(err)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _is_owner_refusal(entry: Any) -> bool:
    """A ``failed_roles`` entry of a role that refused the tool because another owner holds its name."""
    return isinstance(entry, dict) and isinstance(entry.get("owned_by"), str)


def role_problems(failed: list[Any]) -> list[dict[str, str]]:
    """``failed_roles`` entries as details, ``path`` naming the role (wrong shapes are skipped)."""
    problems = []
    for entry in failed:
        if isinstance(entry, dict) and isinstance(entry.get("role"), str):
            error = entry.get("error")
            problems.append({"path": entry["role"], "message": error if isinstance(error, str) else "failed"})
    return problems


def problems_text(problems: list[dict[str, str]]) -> str:
    """`` (Lanlan: …; Yui: …)``, at most three roles named (each message cut at 200 characters), or ''."""
    if not problems:
        return ""

    def cut(text: str) -> str:
        return text[:200] + "…" if len(text) > 200 else text

    named = "; ".join(f"{cut(p['path'])}: {cut(p['message'])}" for p in problems[:3])
    more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
    return f" ({named}{more})"


def proves_not_registered(err: PluginError) -> bool:
    """Whether ``err``, raised by ``register``, proves the tool was not registered: Toolport refused
    the request (4xx), or answered ``ok: false`` with every role refusing it. An ``ok: false``
    whose roles took the tool and failed to sync it (R8), or a request sent and never answered,
    proves nothing; a connection that could not be made proves it too (nothing was sent)."""
    if err._nothing_registered:
        return True
    return err.code == REFUSED and err.status is not None and 400 <= err.status < 500
