"""/invocations' three generation schemas: which one a body is, and what the pipeline calls for it.

The handler is picked by validating the body against each request type in priority order (LMI
`inputs`, OpenAI chat `messages`, OpenAI completion `prompt`); the first that validates wins. When
none validates, the errors of the schema the body was closest to are shown. An LMI request
becomes vLLM's CompletionRequest; its answer is shaped back into LMI's (or TGI's) schema.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import ValidationError

from lmi_server.api.adapters.routing import LMI_MODEL_NAME, adapters_field
from lmi_server.api.errors import APIError, validation_message
from lmi_server.api.openai.routes import chat_call, chat_request_type, completion_call, completion_request_type
from lmi_server.api.pipeline import Generation
from lmi_server.api.sagemaker.lmi_protocol import (
    LMIRequest,
    ParameterError,
    as_sse,
    format_response,
    stream_jsonlines,
    tgi_list,
    to_completion_body,
)


def _schemas():
    return [
        ("lmi", LMIRequest, "inputs"),
        ("chat", chat_request_type(), "messages"),
        ("completion", completion_request_type(), "prompt"),
    ]


def _parameter_errors(exc: ValidationError) -> list[dict]:
    return [e for e in exc.errors() if tuple(e.get("loc", ()))[:1] == ("parameters",)]


def detect_schema(body: Any) -> tuple[str, Any]:
    """The first request type the body validates as. A body that fails the schema its marker
    names is LMI's 424 ("Input parsing failed"), except a bad generation parameter: a 400 that
    names it."""
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    failures: dict[str, str] = {}
    bad_parameters: dict[str, list[dict]] = {}
    for name, model, _ in _schemas():
        try:
            return name, model.model_validate(body)
        except ValidationError as exc:
            failures[name] = validation_message(exc.errors())
            bad_parameters[name] = _parameter_errors(exc) if len(_parameter_errors(exc)) == len(exc.errors()) else []
        except Exception as exc:  # noqa: BLE001 - vLLM's validators raise their own client errors
            failures[name] = str(exc)
    for name, _, marker in _schemas():
        if marker in body:
            if bad_parameters.get(name):
                raise APIError(400, f"invalid parameters: {failures[name]}")
            raise APIError(424, f"Input parsing failed: invalid {name} request: {failures[name]}")
    raise APIError(
        424,
        "Input parsing failed: the body matches none of the accepted schemas: LMI {\"inputs\": \"...\", "
        "\"parameters\": {...}}, OpenAI chat {\"messages\": [...]} or OpenAI completion {\"prompt\": \"...\"}",
    )


@functools.cache
def _completion_fields() -> frozenset[str]:
    """The names vLLM's CompletionRequest takes (read once, not per request)."""
    return frozenset(completion_request_type().model_fields)


def lmi_generation(req: LMIRequest, tgi: bool) -> Generation:
    """An LMI request as vLLM's CompletionRequest, its answer shaped as LMI's (TGI's: a list, or
    server-sent events). Its `model` is set by the pipeline: the adapter resolved, else the base model."""
    if req.stream and isinstance(req.inputs, list) and len(req.inputs) != 1:
        raise APIError(424, "streaming takes a single input; send one request per input")
    try:
        completion_body = to_completion_body(req, LMI_MODEL_NAME, _completion_fields())
        completion_req = completion_request_type().model_validate(completion_body)
    except ParameterError as exc:
        raise APIError(400, str(exc), param=exc.param) from None
    except ValidationError as exc:
        raise APIError(400, f"invalid parameters: {validation_message(exc.errors())}") from None
    except Exception as exc:  # noqa: BLE001 - vLLM's own request validators
        raise APIError(400, f"invalid parameters: {exc}") from None
    if tgi:
        return Generation(
            completion_req, completion_call, shape_json=lambda body: tgi_list(format_response(req, body)),
            shape_stream=lambda events: as_sse(stream_jsonlines(req, events)), stream="sse",
        )
    return Generation(
        completion_req, completion_call, shape_json=lambda body: format_response(req, body),
        shape_stream=lambda events: stream_jsonlines(req, events), stream="jsonl",
    )


def invocations_parser(tgi: bool):
    """`parse` for the pipeline: the body's schema detected; chat and completion bodies are sent to
    vLLM as they are (answers in OpenAI's schema, streamed as jsonlines), LMI's translated."""

    def parse(body: Any) -> Generation:
        schema, parsed = detect_schema(adapters_field(body))
        if schema == "chat":
            return Generation(parsed, chat_call, stream="jsonl")
        if schema == "completion":
            return Generation(parsed, completion_call, stream="jsonl")
        return lmi_generation(parsed, tgi)

    return parse
