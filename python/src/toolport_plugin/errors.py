"""The SDK's errors: one class with a stable ``code``, the same codes as the TypeScript SDK."""
from __future__ import annotations

from typing import Any

#: Every code a ``PluginError`` can carry.
OPTIONS = "TP_ERR_PLUGIN_OPTIONS"  #: the Plugin was given invalid options (``details`` lists each)
STATE = "TP_ERR_PLUGIN_STATE"  #: start() twice or after stop(), a tool added after start()
UNREACHABLE = "TP_ERR_PLUGIN_UNREACHABLE"  #: Toolport did not answer (connection failure, timeout)
REFUSED = "TP_ERR_PLUGIN_REFUSED"  #: Toolport answered with an error, or no role took a registration
START_TIMEOUT = "TP_ERR_PLUGIN_START_TIMEOUT"  #: start() gave up after start_timeout seconds
LISTEN = "TP_ERR_PLUGIN_LISTEN"  #: start() could not listen on host:port (port in use…); not retried

PLUGIN_ERROR_CODES = (OPTIONS, STATE, UNREACHABLE, REFUSED, START_TIMEOUT, LISTEN)


class PluginError(Exception):
    """An error of the plugin SDK.

    Example::

        try:
            await plugin.start()
        except PluginError as err:
            if err.code == "TP_ERR_PLUGIN_REFUSED":
                print(err.status, err.toolport_code)
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int | None = None,
        toolport_code: str | None = None,
        details: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        #: The HTTP status Toolport answered with (REFUSED).
        self.status = status
        #: The ``code`` of Toolport's error body, e.g. ``TP_ERR_ROLE_NOT_FOUND``.
        self.toolport_code = toolport_code
        self.details = details or []
        # Set by the API client on an ``ok: false`` registration answer that every role refused.
        self._nothing_registered = False
        # ... and when they refused it because the name is taken (a local tool, another source's).
        self._name_taken = False

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


def is_transient(err: BaseException) -> bool:
    """True for a failure worth retrying: Toolport down or busy (5xx), or no role took it yet.

    A 4xx answer says the request itself is wrong; it will not heal by waiting, nor does a name
    every role refused because a local tool or another source holds it.
    """
    if not isinstance(err, PluginError):
        return False
    if err.code == UNREACHABLE:
        return True
    if err.code != REFUSED or err._name_taken:
        return False
    return err.status is None or err.status >= 500
