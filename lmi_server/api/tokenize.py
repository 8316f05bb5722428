"""POST /tokenize and POST /detokenize: vLLM's own tokenization endpoints (`ServingTokenization`,
built by vLLM's `init_app_state`), for clients that count or check tokens before they send (a
prompt as text or as chat messages through the model's template; token ids back to text). The body
is read and checked as on /v1/chat/completions (`api/pipeline`: size, readiness, formatter, content
parts, media, "lmi"), a `model` naming an adapter is resolved as there (404 naming what exists),
and no engine slot is taken: nothing is generated."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from lmi_server.api.context import Shape, begin
from lmi_server.api.errors import APIError
from lmi_server.api.front_door import send
from lmi_server.api.openai.routes import parse_request
from lmi_server.api.pipeline import call_serving, check_request, read_checked

TOKENIZE = "/tokenize"
DETOKENIZE = "/detokenize"
PATHS = (TOKENIZE, DETOKENIZE)
router = APIRouter()


class _Union:
    """A pydantic TypeAdapter with the `model_validate` that `parse_request` calls."""

    def __init__(self, union: Any):
        from pydantic import TypeAdapter

        self.model_validate = TypeAdapter(union).validate_python


def check_token_ids(parsed: Any, state: Any) -> None:
    """Ids outside the vocabulary are a 400 (the tokenizer would overflow: a 500)."""
    size = state.engine.model_config.get_vocab_size()
    wrong = next((t for t in getattr(parsed, "tokens", None) or [] if t >= size), None)
    if wrong is not None:
        raise APIError(400, f"tokens: {wrong} is not a token id of this model (0 to {size - 1})", param="tokens")


async def _run(request: Request, request_type: Any, method: str):
    begin(request, Shape.OPENAI)
    body, state = await read_checked(request)  # a `model` naming an adapter: leased, or a 404
    parsed = parse_request(request_type, body)
    await check_request(request, parsed, state, generates=False)
    check_token_ids(parsed, state)
    serving = state.serving.serving_tokenization
    try:
        result = await call_serving(getattr(serving, method)(parsed, request), request)
    except ValueError as exc:  # vLLM's chat rendering refuses the messages (its chat route's 400)
        raise APIError(400, f"messages could not be rendered: {exc}") from None
    return await send(request, result, lambda r: r.model_dump())


@router.post(TOKENIZE)
async def tokenize(request: Request):
    from vllm.entrypoints.serve.tokenize.protocol import TokenizeRequest

    return await _run(request, _Union(TokenizeRequest), "create_tokenize")


@router.post(DETOKENIZE)
async def detokenize(request: Request):
    from vllm.entrypoints.serve.tokenize.protocol import DetokenizeRequest

    return await _run(request, DetokenizeRequest, "create_detokenize")
