"""LMI's decorator for a model.py's response-side function, and the names its examples import.

`@output_formatter`: called with vLLM's response object (CompletionResponse or
ChatCompletionResponse; for a stream, each CompletionStreamResponse / ChatCompletionStreamResponse
chunk); what it returns is sent as is (pydantic models and dicts as JSON).
`RequestOutput`, `TextGenerationOutput`, `Sequence` and `Token` are the types of LMI's older
rolling-batch formatter; they exist so that files importing them load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


def output_formatter(function: Callable) -> Callable:
    function.is_output_formatter = True
    return function


@dataclass
class Token:
    id: int
    text: str
    log_prob: float | None = None
    special_token: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "text": self.text, "log_prob": self.log_prob, "special_token": self.special_token}


@dataclass
class Sequence:
    tokens: list[Token] = field(default_factory=list)
    cumulative_log_prob: float = 0.0
    finish_reason: str | None = None


@dataclass
class RequestOutput:
    request_id: int = 0
    finished: bool = False
    input: Any = None


@dataclass
class TextGenerationOutput(RequestOutput):
    sequences: dict[int, Sequence] = field(default_factory=dict)
    best_sequence_index: int = 0
    prompt_tokens_details: list[Token] = field(default_factory=list)
