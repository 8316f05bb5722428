"""The embedding model's routes: OpenAI's POST /v1/embeddings, SageMaker's POST /invocations in
LMI's embedding schema, and vLLM's /score and /rerank (cosine similarity of the embeddings).
Mounted only for a model of the embed kind (`api/kinds.py`).

The work is vLLM's (`ServingEmbedding`, built by vLLM's `init_app_state` for a pooling model):
tokenization, token limits and truncation, batching, normalization, `dimensions`, `encoding_format`.
Here: the body read once (size limit), the request validated, an engine slot taken, vLLM's client
errors turned into 4xx answers, and on /invocations LMI's envelope: `{"inputs": str | [str]}` in,
a JSON list of vectors out (one per input, as LMI's vLLM handler answers), errors as LMI's flat
`{"error": ..., "code": ...}`.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictStr, TypeAdapter, ValidationError

from lmi_server.api.admit import admit
from lmi_server.api.body import read_json_body
from lmi_server.api.context import Shape, app_context, begin
from lmi_server.api.pipeline import engine_state, until_disconnect
from lmi_server.api.errors import APIError, from_serving_exception, validated, validation_message

router = APIRouter()


class LMIEmbeddingParameters(BaseModel):
    """What an LMI embedding request may ask beyond its texts (all optional)."""

    model_config = ConfigDict(extra="forbid")

    truncate_prompt_tokens: int | None = Field(
        None, ge=-1, description="Keep only the last N tokens of each text (-1: the model's limit); default: refuse a text over the limit."
    )
    dimensions: int | None = Field(None, ge=1, description="Shorter vectors, for models trained for it (Matryoshka).")


class LMIEmbeddingRequest(BaseModel):
    """LMI's embedding request: `{"inputs": "text"}` or `{"inputs": ["text", ...]}`."""

    model_config = ConfigDict(extra="forbid")

    inputs: StrictStr | list[StrictStr] = Field(..., description="One text or a non-empty list of texts.")
    parameters: LMIEmbeddingParameters = Field(default_factory=LMIEmbeddingParameters)

    def texts(self) -> list[str]:
        return [self.inputs] if isinstance(self.inputs, str) else list(self.inputs)


@functools.cache  # built once (about 2 ms each): not per request
def _openai_request_adapter() -> TypeAdapter:
    from vllm.entrypoints.pooling.embed.protocol import EmbeddingRequest

    return TypeAdapter(EmbeddingRequest)


def _embedding_request_type():
    from vllm.entrypoints.pooling.embed.protocol import EmbeddingCompletionRequest

    return EmbeddingCompletionRequest


async def embed(request: Request, parsed: Any, *, serving: str = "serving_embedding") -> Response:
    """Run one request through one of vLLM's pooling serving objects (ServingEmbedding unless told:
    ServingScores for /score and /rerank); its response as vLLM builds it."""
    state = engine_state(request)
    await until_disconnect(admit(request, state, parsed), request)
    try:
        return await until_disconnect(getattr(state.serving, serving)(parsed, request), request)
    except APIError:
        raise
    except Exception as exc:  # noqa: BLE001 - vLLM's serving layer raises its client errors
        mapped = from_serving_exception(exc)
        if mapped is None:
            raise
        raise mapped from None


async def _read_openai_body(request: Request, adapter: TypeAdapter) -> Any:
    begin(request, Shape.OPENAI)
    body = await read_json_body(request, app_context(request).config.server.max_request_bytes)
    engine_state(request)  # 503 first: nothing can run before the engine is ready
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object")
    return validated(adapter.validate_python, body, other_status=400)


@router.post("/v1/embeddings")
async def create_embeddings(request: Request):
    return await embed(request, await _read_openai_body(request, _openai_request_adapter()))


@functools.cache
def _score_adapter() -> TypeAdapter:
    from vllm.entrypoints.pooling.scoring.protocol import ScoreRequest

    return TypeAdapter(ScoreRequest)


@functools.cache
def _rerank_adapter() -> TypeAdapter:
    from vllm.entrypoints.pooling.scoring.protocol import RerankRequest

    return TypeAdapter(RerankRequest)


@router.post("/score")
@router.post("/v1/score")
async def score(request: Request):
    """vLLM's score API: for an embedding model, the cosine similarity of each pair's embeddings."""
    return await embed(request, await _read_openai_body(request, _score_adapter()), serving="serving_scores")


@router.post("/rerank")
@router.post("/v1/rerank")
@router.post("/v2/rerank")
async def rerank(request: Request):
    """vLLM's (Jina/Cohere-style) rerank API: documents ordered by similarity to the query."""
    return await embed(request, await _read_openai_body(request, _rerank_adapter()), serving="serving_scores")


def lmi_embedding_request(body: Any, model: str | None) -> Any:
    """LMI's body -> vLLM's embedding request, or a 400 that says what /invocations takes here."""
    if not isinstance(body, dict):
        raise APIError(400, "request body must be a JSON object: {\"inputs\": \"text\" | [\"text\", ...]}")
    if "inputs" not in body:
        what = "a chat request" if "messages" in body else "a completion request" if "prompt" in body else "this body"
        raise APIError(
            400,
            f"this model embeds text; it does not generate, so {what} cannot be served: send "
            "{\"inputs\": \"text\" | [\"text\", ...]} (or OpenAI's POST /v1/embeddings)",
        )
    try:
        lmi_req = LMIEmbeddingRequest.model_validate(body)
    except ValidationError as exc:
        raise APIError(
            400, f"invalid embedding request: {validation_message(exc.errors())}; send {{\"inputs\": \"text\" | [\"text\", ...]}}",
        ) from None
    texts = lmi_req.texts()
    if not texts:
        raise APIError(400, "inputs is an empty list: send at least one text")
    params = lmi_req.parameters.model_dump(exclude_none=True)
    return _embedding_request_type()(input=texts, model=model, **params)


def request_bodies(components: dict[str, Any]) -> dict[str, Any]:
    """The bodies these routes read themselves, for /openapi.json (`api/openapi.py`): schemas added
    to `components`, path -> schema."""
    ref = "#/components/schemas/{model}"

    def schema(adapter: TypeAdapter, name: str) -> dict[str, Any]:
        doc = adapter.json_schema(ref_template=ref)
        components.update(doc.pop("$defs", {}))
        components[name] = doc
        return {"$ref": ref.format(model=name)}

    openai = schema(_openai_request_adapter(), "EmbeddingRequest")
    score_body = schema(_score_adapter(), "ScoreRequest")
    rerank_body = schema(_rerank_adapter(), "RerankRequest")
    lmi = schema(TypeAdapter(LMIEmbeddingRequest), "LMIEmbeddingRequest")
    return {
        "/v1/embeddings": openai,
        "/invocations": {"anyOf": [lmi, openai]},
        **{path: score_body for path in ("/score", "/v1/score")},
        **{path: rerank_body for path in ("/rerank", "/v1/rerank", "/v2/rerank")},
    }


def vectors(response: Response) -> list[Any]:
    """vLLM's OpenAI embedding response -> LMI's answer: the vectors, in input order."""
    data = json.loads(bytes(response.body))
    return [item["embedding"] for item in sorted(data["data"], key=lambda item: item["index"])]


@router.post("/invocations")
async def invocations(request: Request):
    """LMI's `{"inputs": ...}` -> a list of vectors; OpenAI's `{"input": ...}` (as vLLM's own
    SageMaker route takes it) -> OpenAI's embedding response."""
    begin(request, Shape.LMI)
    try:
        body = await read_json_body(request, app_context(request).config.server.max_request_bytes)
        if isinstance(body, dict) and "input" in body and "inputs" not in body:
            parsed = _openai_request_adapter().validate_python(body)
            return await embed(request, parsed)
        parsed = lmi_embedding_request(body, None)  # no model: vLLM answers with the served name
        return JSONResponse(vectors(await embed(request, parsed)))
    except ValidationError as exc:
        raise APIError(400, f"invalid embedding request: {validation_message(exc.errors())}") from None
