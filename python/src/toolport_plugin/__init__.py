"""Toolport plugins in Python: declare typed tools, serve them, stay registered.

Example::

    from typing import Literal
    from toolport_plugin import Plugin, ToolError

    plugin = Plugin("weather")   # source "plugin:weather"; Toolport at $TOOLPORT_URL or 127.0.0.1:3917

    @plugin.tool(description="Get the weather for a city.")
    async def get_weather(city: str, unit: Literal["c", "f"] = "c") -> dict:
        if city == "Atlantis":
            raise ToolError("NO_DATA", output={"reason": "no such city"})
        return {"city": city, "temperature": 28}

    plugin.run()
"""
from ._options import DEFAULT_TOOLPORT_URL
from ._results import Image, ToolError, ToolOutput
from ._tool import CallContext, Tool
from .errors import PLUGIN_ERROR_CODES, PluginError
from .plugin import Plugin, RegisteredEvent, StartResult, StopResult

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_TOOLPORT_URL",
    "PLUGIN_ERROR_CODES",
    "CallContext",
    "Image",
    "Plugin",
    "PluginError",
    "RegisteredEvent",
    "StartResult",
    "StopResult",
    "Tool",
    "ToolError",
    "ToolOutput",
    "__version__",
]
