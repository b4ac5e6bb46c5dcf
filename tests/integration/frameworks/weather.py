"""The weather agent every framework test plays: the question, the tool's table, and the
scripted model's answers in the embedded chat template's markup (``conftest.py``).

The script thinks and calls ``get_weather`` for Paris, then for Rome, then answers: three
calls, each continuing the one before once the framework echoes the model's turn and sends the
tool's result after it.
"""

from __future__ import annotations

from typing import Any, Final

QUESTION: Final = "Is it warmer in Paris or in Rome?"
USER: Final[Any] = {"role": "user", "content": QUESTION}
WEATHER_IN: Final = {"Paris": "sunny, 21 C", "Rome": "sunny, 25 C"}
SCRIPT: Final = (
    '<think>Paris first.</think><tool_call>{"name": "get_weather", "arguments": '
    '{"city": "Paris"}}</tool_call>',
    '<think>Now Rome.</think><tool_call>{"name": "get_weather", "arguments": '
    '{"city": "Rome"}}</tool_call>',
    "<think>21 is less than 25.</think>It is warmer in Rome.",
)
