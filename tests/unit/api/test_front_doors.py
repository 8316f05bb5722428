"""The Responses / Messages front doors' own parts: the output budget clamp, the bounded response
store given to vLLM's serving object, Anthropic's error format (routes and the API-key check)."""

import asyncio
from types import SimpleNamespace

import httpx
import pytest
from fastapi import FastAPI, Request

from lmi_server import response_store
from lmi_server.api import output_budget
from lmi_server.api.anthropic.errors import error_body_for
from lmi_server.api.context import Shape, begin
from lmi_server.api.auth import APIKeyMiddleware
from lmi_server.api.errors import APIError, install_error_handlers

KEY = "key-front-doors-123"


def test_a_budget_beyond_the_context_is_clamped_to_the_room_left():
    assert output_budget.fitted(32000, 300, 8192) == 7892
    assert output_budget.clamp_header(32000, 7892) == {"x-lmi-max-tokens-clamped": "32000->7892"}


def test_a_budget_that_fits_or_none_is_left_alone():
    assert output_budget.fitted(100, 300, 8192) is None
    assert output_budget.fitted(7892, 300, 8192) is None
    assert output_budget.fitted(None, 300, 8192) is None
    assert output_budget.fitted(50, 9000, 8192) is None  # the prompt alone is too long: vLLM's 400 says so


def test_the_render_is_skipped_only_when_the_request_surely_fits():
    assert not output_budget.could_overflow(256, 1000, 8192)
    assert output_budget.could_overflow(32000, 1000, 8192)
    assert output_budget.could_overflow(4000, 3000, 8192)  # 4000 + 3000 bytes + template margin > 8192
    assert not output_budget.could_overflow(None, 10**6, 8192)


def test_the_store_keeps_the_most_recently_used_and_drops_the_oldest():
    store = response_store.BoundedStore(2)
    store["a"], store["b"] = 1, 2
    assert store.get("a") == 1  # read: "a" is now the newest
    store["c"] = 3
    assert list(store) == ["a", "c"] and store.get("b") is None


def test_vllms_serving_object_gets_bounded_stores_and_storing_on():
    serving = SimpleNamespace(response_store={}, msg_store={}, enable_store=False)
    assert response_store.install(serving, 3)
    assert serving.enable_store is True
    for i in range(10):
        serving.response_store[f"resp_{i}"] = i
        serving.msg_store[f"resp_{i}"] = [i]
    assert list(serving.response_store) == ["resp_7", "resp_8", "resp_9"]
    assert len(serving.msg_store) == 3


def test_size_zero_leaves_vllms_store_off():
    serving = SimpleNamespace(response_store={}, msg_store={}, enable_store=False)
    assert not response_store.install(serving, 0)
    assert serving.enable_store is False and type(serving.response_store) is dict
    assert not response_store.install(None, 10)  # a model that does not generate has no Responses serving


def _call(app, method, path, headers=None):
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return await c.request(method, path, headers=headers or {})
    return asyncio.run(go())


def test_route_errors_leave_in_anthropics_format_with_status_and_headers():
    app = FastAPI()
    install_error_handlers(app)

    async def refuse(request: Request):
        begin(request, Shape.ANTHROPIC)
        raise APIError(429, "tenant over its rate", headers={"Retry-After": "3"})

    app.add_api_route("/v1/messages", refuse, methods=["POST"])
    answer = _call(app, "POST", "/v1/messages")
    assert answer.status_code == 429 and answer.headers["retry-after"] == "3"
    assert answer.json() == {"type": "error", "error": {"type": "rate_limit_error", "message": "tenant over its rate"}}


def test_anthropic_messages_are_not_taken_for_harmony_ones():
    from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest

    from lmi_server.api.pipeline import reject_foreign_messages

    parsed = AnthropicMessagesRequest.model_validate(
        {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    )
    state = SimpleNamespace(engine=SimpleNamespace(model_config=SimpleNamespace(is_multimodal_model=False)))
    reject_foreign_messages(parsed, state)  # no 400: the Messages front door checks its own blocks


@pytest.mark.parametrize("status,kind", [(400, "invalid_request_error"), (422, "invalid_request_error"),
                                         (404, "not_found_error"), (503, "overloaded_error"), (500, "api_error")])
def test_anthropic_error_types(status, kind):
    assert error_body_for("/v1/messages", APIError(status, "m"))["error"]["type"] == kind


def test_the_key_check_answers_each_api_in_its_own_format_and_takes_both_headers():
    app = FastAPI()
    for path in ("/v1/messages", "/v1/messages/count_tokens", "/v1/responses"):
        app.add_api_route(path, lambda: {"ok": True}, methods=["POST"])
    app.add_middleware(APIKeyMiddleware, keys=[KEY], error_body=error_body_for)
    anthropic = _call(app, "POST", "/v1/messages/count_tokens")
    assert anthropic.status_code == 401
    assert anthropic.json()["type"] == "error" and anthropic.json()["error"]["type"] == "authentication_error"
    openai = _call(app, "POST", "/v1/responses", {"Authorization": "Bearer wrong-key-123"})
    assert openai.status_code == 401 and openai.json()["error"]["type"] == "AuthenticationError"
    assert _call(app, "POST", "/v1/messages", {"x-api-key": KEY}).status_code == 200
    assert _call(app, "POST", "/v1/responses", {"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_front_door_routes_have_their_own_metric_labels_and_first_tokens():
    from lmi_server import metrics
    from lmi_server.api.routes import label_for

    assert label_for("/v1/messages") == "/v1/messages" and label_for("/tokenize") == "/tokenize"
    assert label_for("/v1/responses") == "/v1/responses"
    assert label_for("/v1/responses/resp_123") == label_for("/v1/responses/resp_456") == "/v1/responses/{response_id}"
    assert label_for("/v1/responses/resp_123/cancel") == "/v1/responses/{response_id}/cancel"
    assert metrics.TOKEN_CHUNK.search(b'event: response.output_text.delta\ndata: {"delta":"The","type":"x"}')
    assert metrics.TOKEN_CHUNK.search(b'data: {"type":"content_block_delta","delta":{"type":"text_delta","text":"Hi"}}')
    assert not metrics.TOKEN_CHUNK.search(b'data: {"type":"response.created","response":{"text":null}}')


def test_openapi_documents_the_front_doors_bodies(tmp_path):
    from lmi_server.api.app import create_app
    from lmi_server.config.schema import build_serving_config

    doc = create_app(build_serving_config({}, tmp_path), {"model": "x"}, start_engine=False).openapi()

    def body(path):
        return doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]

    assert body("/v1/responses") == {"$ref": "#/components/schemas/ResponsesRequest"}
    assert body("/v1/messages") == {"$ref": "#/components/schemas/AnthropicMessagesRequest"}
    assert body("/v1/messages/count_tokens") == {"$ref": "#/components/schemas/AnthropicCountTokensRequest"}
    assert "anyOf" in body("/tokenize") and body("/detokenize") == {"$ref": "#/components/schemas/DetokenizeRequest"}
    assert "max_tokens" in doc["components"]["schemas"]["AnthropicMessagesRequest"]["required"]


def test_detokenize_refuses_ids_outside_the_vocabulary():
    from lmi_server.api.tokenize import check_token_ids

    state = SimpleNamespace(engine=SimpleNamespace(model_config=SimpleNamespace(get_vocab_size=lambda: 100)))
    check_token_ids(SimpleNamespace(tokens=[0, 99]), state)
    with pytest.raises(APIError) as refused:
        check_token_ids(SimpleNamespace(tokens=[5, 2**62]), state)
    assert refused.value.status == 400 and str(2**62) in refused.value.message


def test_a_null_that_vllm_copies_into_its_response_means_the_default():
    """`"background": null` / `"truncation": null` pass vLLM's request model but not its response
    model (a 500 the fuzzer found): the Responses door reads them as left out."""
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest, ResponsesResponse

    from lmi_server.api.responses.routes import NULL_MEANS_DEFAULT, defaults_for_nulls

    parsed = defaults_for_nulls(ResponsesRequest.model_validate({"input": "hi", "background": None, "truncation": None}))
    assert parsed.background is False and parsed.truncation == "disabled"
    for name in NULL_MEANS_DEFAULT:  # still a field the response requires non-null
        assert ResponsesResponse.model_fields[name].is_required()
    kept = defaults_for_nulls(ResponsesRequest.model_validate({"input": "hi", "truncation": "auto"}))
    assert kept.truncation == "auto" and kept.background is False
