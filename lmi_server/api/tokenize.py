"""POST /tokenize and POST /detokenize: vLLM's own tokenization endpoints (`ServingTokenization`,
built by vLLM's `init_app_state`), for clients that count or check tokens before they send (a
prompt as text or as chat messages through the model's template; token ids back to text). The body
is read and validated as on the other routes, a `model` naming an adapter is resolved as there (404
naming what exists), and no engine slot is taken: nothing is generated."""

from __future__ import annotations

from fastapi import APIRouter, Request

from lmi_server.api.front_door import read_request, resolve_model
from lmi_server.api.openai import check_messages_and_model
from lmi_server.api.generation import as_response, call_serving, engine_state

TOKENIZE = "/tokenize"
DETOKENIZE = "/detokenize"
PATHS = (TOKENIZE, DETOKENIZE)
router = APIRouter()


class _Union:
    """A pydantic TypeAdapter with the `model_validate` that `read_request` calls."""

    def __init__(self, union):
        from pydantic import TypeAdapter

        self.model_validate = TypeAdapter(union).validate_python


@router.post(TOKENIZE)
async def tokenize(request: Request):
    from vllm.entrypoints.serve.tokenize.protocol import TokenizeRequest

    parsed, _ = await read_request(request, _Union(TokenizeRequest))
    state = engine_state(request)
    await check_messages_and_model(request, parsed, state)  # chat messages: as on /v1/chat/completions
    await resolve_model(request, state, parsed)
    return await as_response(await call_serving(state.serving.serving_tokenization.create_tokenize(parsed, request), request), request)


@router.post(DETOKENIZE)
async def detokenize(request: Request):
    from vllm.entrypoints.serve.tokenize.protocol import DetokenizeRequest

    parsed, _ = await read_request(request, DetokenizeRequest)
    state = engine_state(request)
    await resolve_model(request, state, parsed)
    return await as_response(await call_serving(state.serving.serving_tokenization.create_detokenize(parsed, request), request), request)
