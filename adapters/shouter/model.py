"""Formatters of the `shouter` example adapter, written against LMI's contract (djl_python's
decorators; see lmi_server/adapters/formatters.py).

@input_formatter gets the decoded request body: LMI requests without max_new_tokens get 16.
@output_formatter gets vLLM's response object, or each raw stream chunk ("data: {...}"), and
upper-cases the generated text in it. It returns the same kind of thing it got, so the server
still shapes the answer for the request's schema (LMI's generated_text and token lines, OpenAI's
choices).
"""

import json

from djl_python.input_parser import input_formatter
from djl_python.output_formatter import output_formatter


@input_formatter
def short_answers(payload, **kwargs):
    parameters = payload.get("parameters") if "inputs" in payload else None
    if "inputs" in payload and parameters is None:
        payload["parameters"] = parameters = {}
    if isinstance(parameters, dict):
        parameters.setdefault("max_new_tokens", 16)
    return payload


def _shout(choice: dict) -> None:
    if isinstance(choice.get("text"), str):
        choice["text"] = choice["text"].upper()
    for part in (choice.get("message"), choice.get("delta")):
        if isinstance(part, dict) and isinstance(part.get("content"), str):
            part["content"] = part["content"].upper()


@output_formatter
def shout(response):
    if isinstance(response, str):  # one stream chunk, as vLLM yields it
        data = response[len("data:"):].strip()
        if data == "[DONE]":
            return response
        chunk = json.loads(data)
        for choice in chunk.get("choices") or []:
            _shout(choice)
        return "data: " + json.dumps(chunk) + "\n\n"
    for choice in response.choices:
        if getattr(choice, "text", None) is not None:
            choice.text = choice.text.upper()
        message = getattr(choice, "message", None)
        if message is not None and isinstance(message.content, str):
            message.content = message.content.upper()
    return response
