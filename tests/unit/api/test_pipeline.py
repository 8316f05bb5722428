"""The one pipeline (api/pipeline.serve) behind every generating front door, with a fake vLLM
serving layer: each front door's shape carried to its answer and its errors, the adapter named
by the body resolved before the vLLM call, the ticket released, and a new front door being one
`parse` function handed to `serve`."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import httpx
from fastapi import Request
from pydantic import BaseModel

from lmi_server.api.app import create_app
from lmi_server.api.context import Shape
from lmi_server.api.errors import APIError
from lmi_server.api.pipeline import Generation, serve
from lmi_server.config.schema import build_serving_config


class Choice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str = "length"


class Completion(BaseModel):
    choices: list[Choice]


class FakeCompletions:
    """vLLM's OpenAIServingCompletion as the pipeline calls it; an ErrorResponse when told."""

    def __init__(self):
        self.requests = []
        self.error = None

    async def create_completion(self, request, raw_request):
        self.requests.append(request)
        if self.error is not None:
            return self.error
        return Completion(choices=[Choice(text=f"<{request.prompt}>")])


def error_response(code: int, message: str, param: str | None = None):
    error = SimpleNamespace(code=code, message=message, param=param)
    return type("ErrorResponse", (), {"error": error})()


def app_with_engine(tmp_path, props=None):
    app = create_app(build_serving_config(props or {}, tmp_path), {"model": "x"}, start_engine=False)
    completions = FakeCompletions()
    models = SimpleNamespace(base_model_paths=[SimpleNamespace(name="base-model")], is_base_model=lambda m: m == "base-model")
    owner = app.state.ctx.owner
    owner.state.status, owner.state.engine = "ready", SimpleNamespace(errored=False)
    owner.state.serving = SimpleNamespace(openai_serving_completion=completions, openai_serving_models=models)
    return app, completions


def post(app, path, body, headers=None):
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url="http://t") as c:
            return await c.post(path, content=json.dumps(body), headers={"content-type": "application/json", **(headers or {})})
    return asyncio.run(go())


def test_each_front_door_shapes_the_same_generation_its_own_way(tmp_path):
    app, completions = app_with_engine(tmp_path)
    openai = post(app, "/v1/completions", {"model": "lmi", "prompt": "a", "max_tokens": 2})
    assert openai.status_code == 200 and openai.json()["choices"][0]["text"] == "<a>"
    lmi = post(app, "/invocations", {"inputs": "b", "parameters": {"max_new_tokens": 2}})
    assert lmi.status_code == 200 and lmi.json() == {"generated_text": "<b>"}
    assert [r.model for r in completions.requests] == ["base-model", "base-model"]  # "lmi" names the base model
    assert app.state.ctx.admission.active == 0  # both tickets released when the responses were over


def test_errors_take_the_shape_of_the_front_door(tmp_path):
    app, completions = app_with_engine(tmp_path)
    completions.error = error_response(400, "This model's maximum context length is 8 tokens", "prompt")
    openai = post(app, "/v1/completions", {"prompt": "a"})
    assert openai.status_code == 400 and openai.json()["error"]["param"] == "prompt"
    lmi = post(app, "/invocations", {"inputs": "a"})  # LMI answers a prompt too long with 424
    assert lmi.status_code == 424 and lmi.json() == {"error": "This model's maximum context length is 8 tokens", "code": 424}


def test_an_adapter_named_with_lora_off_is_refused_before_vllm_is_called(tmp_path):
    app, completions = app_with_engine(tmp_path)
    for path, body in [("/v1/completions", {"model": "pirate", "prompt": "a"}), ("/invocations", {"inputs": "a", "adapters": "pirate"})]:
        r = post(app, path, body)
        assert r.status_code == 404 and "'pirate'" in r.text
    assert completions.requests == []


def test_a_new_front_door_is_one_parse_function(tmp_path):
    """What the Anthropic front door will do: its shape, its parse, vLLM's call, its answer."""
    app, completions = app_with_engine(tmp_path)
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    def parse(body):
        if not body.get("messages"):
            raise APIError(400, "messages: at least one message")
        prompt = body["messages"][-1]["content"]
        return Generation(
            CompletionRequest(model=body.get("model"), prompt=prompt, max_tokens=body.get("max_tokens", 4)),
            lambda serving: serving.openai_serving_completion.create_completion,
            shape_json=lambda done: {"type": "message", "content": [{"type": "text", "text": done["choices"][0]["text"]}]},
        )

    @app.post("/test/messages")
    async def messages(request: Request):
        return await serve(request, parse, shape=Shape.ANTHROPIC, headers={"anthropic-version": "2023-06-01"})

    ok = post(app, "/test/messages", {"model": "base-model", "messages": [{"role": "user", "content": "hi"}]})
    assert ok.status_code == 200 and ok.json()["content"][0]["text"] == "<hi>" and ok.headers["anthropic-version"] == "2023-06-01"
    bad = post(app, "/test/messages", {"model": "base-model", "messages": []})
    assert bad.status_code == 400
    assert bad.json() == {"type": "error", "error": {"type": "invalid_request_error", "message": "messages: at least one message"}}
    unknown = post(app, "/test/messages", {"model": "ghost", "messages": [{"role": "user", "content": "hi"}]})
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error"


def test_the_admitted_tenant_is_named_in_the_vllm_request_for_the_engines_scheduler(tmp_path):
    app, completions = app_with_engine(tmp_path, {"option.tenant_header": "x-tenant-id"})
    # a client's own value under the scheduler's key is replaced; its other extra arguments are kept
    body = {"prompt": "a", "max_tokens": 2, "vllm_xargs": {"lmi_tenant": "mallory", "keep": 1}}
    assert post(app, "/v1/completions", body, {"x-tenant-id": "alice"}).status_code == 200
    assert post(app, "/invocations", {"inputs": "b"}).status_code == 200
    assert completions.requests[0].vllm_xargs == {"lmi_tenant": "alice", "keep": 1}
    assert completions.requests[1].vllm_xargs == {"lmi_tenant": "default"}
    params = completions.requests[0].to_sampling_params(2, None)
    assert params.extra_args["lmi_tenant"] == "alice"  # what the engine's scheduler reads
