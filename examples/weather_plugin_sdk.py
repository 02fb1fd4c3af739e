"""The weather plugin again, with the Python SDK (python/, package toolport_plugin).

The SDK serves the callback, registers get_weather with every role, registers it again after a
Toolport restart or an eviction, and clears it on SIGINT/SIGTERM.

    pip install ./python
    TOOLPORT_URL=http://127.0.0.1:3917 python3 examples/weather_plugin_sdk.py
"""
import logging
from typing import Literal

from toolport_plugin import Plugin, ToolError

FORECASTS = {"shanghai": 28, "oslo": -3}
plugin = Plugin("weather-sdk")  # source "plugin:weather-sdk"; Toolport at $TOOLPORT_URL


@plugin.tool(description="Get the weather for a city.")
async def get_weather(city: str, unit: Literal["c", "f"] = "c") -> dict:
    celsius = FORECASTS.get(city.lower())
    if celsius is None:
        raise ToolError("NO_DATA", output={"reason": f"no forecast for {city}"})
    return {"city": city, "temperature": celsius if unit == "c" else round(celsius * 9 / 5 + 32), "unit": unit}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    plugin.run()
