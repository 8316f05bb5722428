"""Each model kind mounts its own routes and refuses the other kind's with a 400 that says what the
model does; the embedding routes shape LMI's /invocations answer and map vLLM's errors (a fake
ServingEmbedding stands in for vLLM's)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import httpx
import pytest
from fastapi.responses import JSONResponse

from lmi_server.api.app import create_app
from lmi_server.config.schema import build_serving_config


def post(app, path, body):
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url="http://t") as c:
            return await c.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
    return asyncio.run(go())


class FakeEmbedding:
    """vLLM's ServingEmbedding as the routes see it: called with the request, returns a response."""

    def __init__(self, error: BaseException | None = None):
        self.error = error
        self.requests = []

    async def __call__(self, request, raw_request):
        self.requests.append(request)
        if self.error is not None:
            raise self.error
        texts = request.input if isinstance(request.input, list) else [request.input]
        data = [{"index": i, "object": "embedding", "embedding": [float(len(t)), float(i)]} for i, t in enumerate(texts)]
        data.reverse()  # the answer is put back in input order
        return JSONResponse({"object": "list", "data": data, "model": "all-minilm-l6-v2", "usage": {}})


def app_of(kind_props: dict[str, str], tmp_path, serving=None):
    app = create_app(build_serving_config(kind_props, tmp_path), {"model": "x"}, start_engine=False)
    if serving is not None:
        owner = app.state.ctx.owner
        owner.state.status, owner.state.engine = "ready", SimpleNamespace(errored=False)
        owner.state.serving = SimpleNamespace(serving_embedding=serving)
    return app


EMBED = {"option.model_id": "all-minilm-l6-v2"}


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", {"model": "m", "prompt": "hi"}),
])
def test_generation_routes_on_an_embedding_model_say_it_embeds(tmp_path, path, body):
    r = post(app_of(EMBED, tmp_path), path, body)
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "this model embeds text" in message and "/v1/embeddings" in message and path in message


@pytest.mark.parametrize("body,what", [
    ({"messages": [{"role": "user", "content": "hi"}]}, "a chat request"),
    ({"prompt": "hi"}, "a completion request"),
])
def test_generation_bodies_on_embedding_invocations_are_lmi_400s(tmp_path, body, what):
    r = post(app_of(EMBED, tmp_path), "/invocations", body)
    assert r.status_code == 400
    assert r.json()["code"] == 400 and "embeds text" in r.json()["error"] and what in r.json()["error"]


@pytest.mark.parametrize("path,body", [
    ("/v1/embeddings", {"model": "m", "input": "hi"}),
    ("/score", {"model": "m", "text_1": "a", "text_2": "b"}),
    ("/rerank", {"model": "m", "query": "a", "documents": ["b"]}),
])
def test_embedding_routes_on_a_generating_model_say_it_generates(tmp_path, path, body):
    r = post(app_of({}, tmp_path), path, body)
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "this model generates text" in message and "option.task=text-embedding" in message


def test_score_and_rerank_go_to_vllms_scoring(tmp_path):
    scores = FakeEmbedding()
    app = app_of(EMBED, tmp_path, FakeEmbedding())
    app.state.ctx.owner.state.serving.serving_scores = scores
    for path, body in [("/score", {"text_1": "a", "text_2": ["b", "c"]}), ("/v1/rerank", {"query": "a", "documents": ["b"]})]:
        scores.error = ValueError("bad pair")
        r = post(app, path, body)
        assert r.status_code == 400 and r.json()["error"]["message"] == "bad pair"
    assert [type(r).__name__ for r in scores.requests] == ["ScoreTextRequest", "RerankRequest"]


def test_lmi_invocations_answer_a_list_of_vectors_in_input_order(tmp_path):
    serving = FakeEmbedding()
    app = app_of(EMBED, tmp_path, serving)
    one = post(app, "/invocations", {"inputs": "abc"})
    assert one.status_code == 200 and one.json() == [[3.0, 0.0]]
    many = post(app, "/invocations", {"inputs": ["a", "bb", "ccc"], "parameters": {"truncate_prompt_tokens": 5}})
    assert many.json() == [[1.0, 0.0], [2.0, 1.0], [3.0, 2.0]]
    assert serving.requests[-1].truncate_prompt_tokens == 5 and serving.requests[-1].input == ["a", "bb", "ccc"]
    openai_shape = post(app, "/invocations", {"input": ["a"]})
    assert openai_shape.json()["object"] == "list"


@pytest.mark.parametrize("body,needle", [
    ({"inputs": []}, "empty list"),
    ({"inputs": 5}, "inputs"),
    ({"inputs": ["a", 3]}, "inputs"),
    ({"inputs": "a", "parameters": {"max_new_tokens": 4}}, "max_new_tokens"),
    ({"inputs": "a", "parameters": {"dimensions": 0}}, "dimensions"),
    (["a"], "JSON object"),
])
def test_bad_lmi_embedding_bodies_are_lmi_400s_naming_the_problem(tmp_path, body, needle):
    serving = FakeEmbedding()
    r = post(app_of(EMBED, tmp_path, serving), "/invocations", body)
    assert r.status_code == 400 and r.json()["code"] == 400 and needle in r.json()["error"]
    assert serving.requests == []


def test_vllm_client_errors_are_4xx_in_each_schema_and_server_errors_stay_500(tmp_path):
    from vllm.exceptions import VLLMValidationError

    too_long = VLLMValidationError("This model's maximum context length is 256 tokens. However, you requested 300 tokens.")
    for error, status in [(too_long, 400), (ValueError("Model does not support Matryoshka"), 400), (RuntimeError("bug"), 500)]:
        app = app_of(EMBED, tmp_path, FakeEmbedding(error))
        lmi = post(app, "/invocations", {"inputs": "x"})
        openai = post(app, "/v1/embeddings", {"input": "x"})
        assert (lmi.status_code, openai.status_code) == (status, status)
        if status == 400:
            assert lmi.json() == {"error": str(error), "code": 400}
            assert openai.json()["error"]["message"] == str(error)


def test_openai_embedding_bodies_are_validated_before_the_engine(tmp_path):
    serving = FakeEmbedding()
    app = app_of(EMBED, tmp_path, serving)
    assert post(app, "/v1/embeddings", {"input": "x", "encoding_format": "hex"}).status_code == 422
    assert post(app, "/v1/embeddings", ["x"]).status_code == 400
    assert serving.requests == []
    ok = post(app, "/v1/embeddings", {"input": ["x", "yy"], "encoding_format": "base64"})
    assert ok.status_code == 200 and serving.requests[-1].encoding_format == "base64"


def test_health_and_models_routes_are_there_for_every_kind(tmp_path):
    for props in (EMBED, {}):
        paths = {getattr(r, "path", None) for r in app_of(props, tmp_path).routes}
        assert {"/ping", "/live", "/v1/models", "/invocations"} <= paths


def test_an_embedding_request_counts_its_texts_and_no_generated_tokens_against_rate_limits():
    from vllm.entrypoints.pooling.embed.protocol import EmbeddingCompletionRequest

    from lmi_server.admission import estimate_tokens

    assert estimate_tokens(EmbeddingCompletionRequest(input=["a" * 400, "b" * 400])) == 200
    assert estimate_tokens(EmbeddingCompletionRequest(input="a" * 40)) == 10


def test_openapi_shows_the_bodies_of_the_kinds_routes(tmp_path):
    def body(doc, path):
        return doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]

    embed_doc = app_of(EMBED, tmp_path).openapi()
    assert body(embed_doc, "/v1/embeddings") == {"$ref": "#/components/schemas/EmbeddingRequest"}
    assert {"$ref": "#/components/schemas/LMIEmbeddingRequest"} in body(embed_doc, "/invocations")["anyOf"]
    assert body(embed_doc, "/score") == {"$ref": "#/components/schemas/ScoreRequest"}
    assert "inputs" in embed_doc["components"]["schemas"]["LMIEmbeddingRequest"]["properties"]
    assert "/v1/chat/completions" not in embed_doc["paths"]  # refusals are not documented as routes
    generate_doc = app_of({}, tmp_path).openapi()
    assert {"$ref": "#/components/schemas/LMIRequest"} in body(generate_doc, "/invocations")["anyOf"]
    assert "/v1/embeddings" not in generate_doc["paths"]


def test_a_classification_model_refuses_generation_and_embedding_alike(tmp_path):
    directory = tmp_path / "classifier"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"architectures": ["BertForSequenceClassification"]}))
    app = app_of({"option.model_id": str(directory)}, tmp_path)
    for path, body in [("/invocations", {"inputs": "x"}), ("/v1/embeddings", {"input": "x"}), ("/v1/completions", {"prompt": "x"})]:
        r = post(app, path, body)
        assert r.status_code == 400
        error = r.json()["error"]
        assert "this model classifies text" in (error if path == "/invocations" else error["message"])
