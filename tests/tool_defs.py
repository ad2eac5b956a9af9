"""The function tools the tool-call tests offer a model (OpenAI's shape), and their
parameter schemas by name."""

from __future__ import annotations

from typing import Any


def function_tool(
    name: str, description: str, properties: dict[str, Any], required: list[str]
) -> dict[str, Any]:
    """An OpenAI function tool whose parameters are an object of these properties, no
    others allowed."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }


def weather_tool(**extra: Any) -> dict[str, Any]:
    """get_weather(city, unit), with any extra (optional) properties."""
    city_unit = {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    }
    return function_tool(
        "get_weather", "Get the current weather in a city", city_unit | extra, ["city", "unit"]
    )


def add_tool(bound: int) -> dict[str, Any]:
    """add(a, b) over integers in [-bound, bound]."""
    integer = {"type": "integer", "minimum": -bound, "maximum": bound}
    return function_tool("add", "Add two integers", {"a": integer, "b": integer}, ["a", "b"])


WEATHER = weather_tool()
ADD = add_tool(1000000)
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
