"""LMI's decorators for a model.py's request-side functions: they only mark the function.

`@input_formatter`: called with the decoded JSON payload (a dict) and `tokenizer=`, before the
server detects the request's schema; returns the payload to serve. `@init_handler` and
`@prediction_handler` (custom loading and prediction) are marked too, and refused at load with
a clear error: this server always runs vLLM.
"""

from __future__ import annotations

from typing import Callable


def input_formatter(function: Callable) -> Callable:
    function.is_input_formatter = True
    return function


def init_handler(function: Callable) -> Callable:
    function.is_init_handler = True
    return function


def prediction_handler(function: Callable) -> Callable:
    function.is_prediction_handler = True
    return function
